// Package redisconn builds the go-redis client the enforcer and the gateway
// Checker use for enforcement flags: a client of one Redis, of a Redis
// Cluster when redis.cluster is set, or of the primary that Redis Sentinels
// name when redis.sentinel.master is set (docs/scaling.md). Either way callers
// get a redis.UniversalClient and must keep every multi-key command within
// one hash slot (sdk/go/flags puts each tenant's keys under a hash tag).
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// Config says where Redis is: one server at Addr, or, with Cluster, a
// Redis Cluster found through its seed nodes Addrs (or Addr alone).
type Config struct {
	Addr         string             `yaml:"addr" help:"Redis address host:port (with cluster and no addrs: the one seed node)"`
	Cluster      bool               `yaml:"cluster" help:"Redis is a Redis Cluster: connect through the seed nodes in addrs (or addr) and follow its slot map"`
	Addrs        []string           `yaml:"addrs" help:"Redis Cluster seed nodes host:port, comma separated (needs cluster=true; any reachable one finds the others)"`
	Username     string             `yaml:"username" help:"Redis ACL user (empty: the default user)"`
	Password     tlsconfig.Password `yaml:"password" help:"Redis password (prefer password_file or the environment; never logged)"`
	PasswordFile string             `yaml:"password_file" help:"file holding the Redis password (e.g. a mounted secret)"`
	DB           int                `yaml:"db" help:"Redis database number"`
	DialTimeout  time.Duration      `yaml:"dial_timeout" help:"timeout for one connection attempt"`
	PoolSize     int                `yaml:"pool_size" help:"connections per client"`
	TLS          tlsconfig.Config   `yaml:"tls"`
	// KeyPrefix starts every key Sluice writes; each use adds its part
	// (Prefix). Everything sharing a Redis and a prefix shares its flags,
	// limits and counts, so a test or a second deployment takes its own.
	KeyPrefix string `yaml:"key_prefix" help:"prefix of every Redis key Sluice uses (flags, admission counters, shared upstream counts, deferred tasks), each use under a part of its own: <prefix>flags:, <prefix>adm:, <prefix>up:, <prefix>deferred:"`
	// Sentinel, with a master name, replaces Addr by the primary the
	// Sentinels name, followed across failovers.
	Sentinel Sentinel `yaml:"sentinel"`
}

// The parts of the key space under Config.KeyPrefix, one per use. Their
// defaults under "sluice:" are the SDK's own defaults (flags.DefaultPrefix,
// admission.DefaultPrefix), so that a gateway on the SDK's defaults meets
// a deployment on Sluice's.
const (
	// FlagKeys are the enforcement flags (the enforcer writes, Checkers read).
	FlagKeys = "flags:"
	// AdmissionKeys are admission's counters; SoftLimitKeys the tenants'
	// soft per-minute quotas, counted apart.
	AdmissionKeys = "adm:"
	SoftLimitKeys = "adm:soft:"
	// UpstreamKeys are the shared upstreams' fleet-wide counts.
	UpstreamKeys = "up:"
	// DeferredKeys are deferred tasks' states and results.
	DeferredKeys = "deferred:"
)

// DefaultKeyPrefix is key_prefix's default.
const DefaultKeyPrefix = "sluice:"

// Prefix is the key prefix of part (FlagKeys, AdmissionKeys, ...).
func (c Config) Prefix(part string) string { return c.KeyPrefix + part }

// Sentinel finds a single-primary Redis through Redis Sentinel: the client
// asks the Sentinels for the primary of Master, connects to it, and moves
// to the new primary when they fail over (go-redis's FailoverClient). TLS,
// username and password (redis.tls, redis.username, redis.password) are
// the data nodes'; the Sentinels' own password is separate.
type Sentinel struct {
	Master       string             `yaml:"master" help:"Sentinel master name of the Redis primary; set, redis.addr is ignored and the client follows the primary the Sentinels name, across failovers"`
	Addrs        []string           `yaml:"addrs" help:"Sentinel addresses host:port, comma separated (with sentinel.master)"`
	Password     tlsconfig.Password `yaml:"password" help:"password of the Sentinels themselves (requirepass of sentinel.conf; prefer password_file)"`
	PasswordFile string             `yaml:"password_file" help:"file holding the Sentinels' password"`
}

// Enabled reports whether the client goes through Sentinels.
func (s Sentinel) Enabled() bool { return s.Master != "" }

// Defaults points at the services script's Redis.
func Defaults() Config {
	return Config{Addr: "127.0.0.1:16379", DialTimeout: 2 * time.Second, PoolSize: 16, KeyPrefix: DefaultKeyPrefix}
}

// Seeds returns the addresses a cluster client starts from: Addrs, or
// Addr when Addrs is empty.
func (c Config) Seeds() []string {
	if len(c.Addrs) > 0 {
		return c.Addrs
	}
	return []string{c.Addr}
}

// Validate checks the address and pool settings.
func (c Config) Validate() error {
	var errs []error
	if c.KeyPrefix == "" || len(c.KeyPrefix) > 200 {
		errs = append(errs, fmt.Errorf("redis.key_prefix: %q must be 1..200 bytes (default %q)", c.KeyPrefix, DefaultKeyPrefix))
	}
	switch {
	case c.Sentinel.Enabled():
		if c.Cluster {
			errs = append(errs, errors.New("redis.sentinel.master: set with redis.cluster=true; a Redis Cluster fails over by itself, Sentinel is for a single primary"))
		}
		if len(c.Sentinel.Addrs) == 0 {
			errs = append(errs, fmt.Errorf("redis.sentinel.addrs: empty, but redis.sentinel.master is %q: name the Sentinels", c.Sentinel.Master))
		}
		for i, a := range c.Sentinel.Addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				errs = append(errs, fmt.Errorf("redis.sentinel.addrs[%d]: %q is not host:port", i, a))
			}
		}
		if len(c.Addrs) > 0 {
			errs = append(errs, errors.New("redis.addrs: set with redis.sentinel.master; the Sentinels name the primary"))
		}
		if _, err := tlsconfig.Secret("redis.sentinel.password", c.Sentinel.Password, c.Sentinel.PasswordFile); err != nil {
			errs = append(errs, err)
		}
	case len(c.Sentinel.Addrs) > 0:
		errs = append(errs, errors.New("redis.sentinel.addrs: set without redis.sentinel.master (the name the Sentinels monitor the primary under)"))
	case !c.Cluster:
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("redis.addr: %q is not host:port", c.Addr))
		}
		if len(c.Addrs) > 0 {
			errs = append(errs, fmt.Errorf("redis.addrs: %d seed nodes given without redis.cluster=true (set it for a Redis Cluster; a single Redis has one address, redis.addr)", len(c.Addrs)))
		}
	case len(c.Addrs) == 0:
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("redis.addr: %q is not host:port (redis.cluster=true and redis.addrs is empty, so it is the seed node)", c.Addr))
		}
	default:
		for i, a := range c.Addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				errs = append(errs, fmt.Errorf("redis.addrs[%d]: %q is not host:port", i, a))
			}
		}
	}
	if c.Cluster && c.DB != 0 {
		errs = append(errs, fmt.Errorf("redis.db: %d, but a Redis Cluster has only database 0", c.DB))
	} else if c.DB < 0 || c.DB > 15 {
		errs = append(errs, fmt.Errorf("redis.db: %d is outside 0..15", c.DB))
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, errors.New("redis.dial_timeout: must be positive"))
	}
	if c.PoolSize < 1 {
		errs = append(errs, errors.New("redis.pool_size: must be at least 1"))
	}
	// Each checked apart so one start-up error lists every mistake.
	if _, err := tlsconfig.Secret("redis.password", c.Password, c.PasswordFile); err != nil {
		errs = append(errs, err)
	}
	if err := c.TLS.Validate("redis.tls"); err != nil {
		errs = append(errs, err)
	}
	if c.Username != "" && c.Password == "" && c.PasswordFile == "" {
		errs = append(errs, fmt.Errorf("redis.password: required with redis.username %q (or redis.password_file)", c.Username))
	}
	return errors.Join(errs...)
}

// NewClient returns a client for c: a *redis.Client, a
// *redis.ClusterClient when c.Cluster is set, or a *redis.Client that
// follows the Sentinels' primary (redis.NewFailoverClient) when
// c.Sentinel.Master is set. It does not connect until first use.
//
// A TLS file or password file that cannot be read (Validate reports it at
// start-up; it can still vanish afterwards) does not panic and does not
// fall back to plaintext: every command of the client fails with the error
// naming the setting, so the readiness check shows it.
func NewClient(c Config, opts ...ClientOption) redis.UniversalClient {
	var co clientOptions
	for _, opt := range opts {
		opt(&co)
	}
	u, err := c.options()
	if err != nil {
		return failing(c, err, c.Cluster, co)
	}
	// One set of options, converted for each kind of client, so that a
	// setting cannot reach one kind and miss another.
	u.ContextTimeoutEnabled = co.contextTimeouts
	if c.Sentinel.Enabled() {
		spass, err := tlsconfig.Secret("redis.sentinel.password", c.Sentinel.Password, c.Sentinel.PasswordFile)
		if err != nil {
			return failing(c, err, false, co)
		}
		u.Addrs, u.MasterName, u.SentinelPassword = c.Sentinel.Addrs, c.Sentinel.Master, spass
		return redis.NewFailoverClient(u.Failover())
	}
	if c.Cluster {
		u.Addrs = c.Seeds()
		o := u.Cluster()
		// go-redis re-reads the slot map only on MOVED or when it is
		// older than this (60 s by default); a master's failover
		// answers nothing but refused connections until then.
		o.ClusterStateReloadInterval = 10 * time.Second
		cc := redis.NewClusterClient(o)
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(reloadOnDialError{cc}) })
		return cc
	}
	return redis.NewClient(u.Simple())
}

// failing returns a client whose every command fails with err: a cluster
// client when cluster is set, a single one otherwise.
func failing(c Config, err error, cluster bool, co clientOptions) redis.UniversalClient {
	dial := func(context.Context, string, string) (net.Conn, error) { return nil, fmt.Errorf("redis: %w", err) }
	if cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds(), Dialer: dial, MaxRetries: -1,
			ContextTimeoutEnabled: co.contextTimeouts})
	}
	return redis.NewClient(&redis.Options{Addr: c.Addr, Dialer: dial, MaxRetries: -1, ContextTimeoutEnabled: co.contextTimeouts})
}

// reloadOnDialError re-reads a Redis Cluster's slot map when a node cannot
// be dialled: a master killed and replaced by its replica leaves every
// command for its slots failing on the dead address until the client
// learns the new map (measured: 45 s and more with go-redis's defaults;
// TestFaultRedisMasterKill in e2e). go-redis coalesces the reloads.
type reloadOnDialError struct{ cc *redis.ClusterClient }

func (h reloadOnDialError) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			h.cc.ReloadState(context.Background())
		}
		return conn, err
	}
}

func (reloadOnDialError) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (reloadOnDialError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ClientOption adjusts a client NewClient makes beyond what Config says.
type ClientOption func(*clientOptions)

type clientOptions struct {
	contextTimeouts bool
}

// ContextTimeouts makes the client bound each command by its context's
// deadline, down to the socket, instead of only by the read and write
// timeouts. A caller that promises a latency bound needs it: admission
// (sdk/go/admission.New) refuses a client without it, since a slow Redis
// would otherwise hold a request past WithMaxWait.
func ContextTimeouts() ClientOption { return func(o *clientOptions) { o.contextTimeouts = true } }

func (c Config) options() (*redis.UniversalOptions, error) {
	pass, err := tlsconfig.Secret("redis.password", c.Password, c.PasswordFile)
	if err != nil {
		return nil, err
	}
	if c.Username != "" && pass == "" {
		return nil, fmt.Errorf("redis.password: required with redis.username %q (or redis.password_file)", c.Username)
	}
	tc, err := c.TLS.Build("redis.tls")
	if err != nil {
		return nil, err
	}
	return &redis.UniversalOptions{
		Addrs:       []string{c.Addr},
		Username:    c.Username,
		Password:    pass,
		DB:          c.DB,
		DialTimeout: c.DialTimeout,
		PoolSize:    c.PoolSize,
		TLSConfig:   tc,
		// Flags must keep flowing when Redis is slow: fail fast and let the
		// caller retry rather than pile up blocked writers.
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
	}, nil
}

// Ready returns a readiness check of a client NewClient made. It pings
// Redis — every master, for a cluster — and says so when the client's
// kind does not match the server's: a plain client on a cluster node
// reaches only that node's slots, and a cluster client cannot start on a
// server without cluster support.
func Ready(cl redis.UniversalClient) func(context.Context) error {
	return func(ctx context.Context) error {
		switch cl := cl.(type) {
		case *redis.ClusterClient:
			err := cl.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
				if err := node.Ping(ctx).Err(); err != nil {
					return fmt.Errorf("node %s: %w", node.Options().Addr, err)
				}
				return nil
			})
			if err != nil {
				if strings.Contains(err.Error(), "cluster support disabled") {
					return fmt.Errorf("redis cluster unreachable: %w (redis.cluster is true but %s is not a Redis Cluster node; unset redis.cluster for a single Redis)", err, strings.Join(cl.Options().Addrs, ","))
				}
				return fmt.Errorf("redis cluster unreachable: %w%s", err, tlsHint(err, cl.Options().TLSConfig == nil, strings.Join(cl.Options().Addrs, ",")))
			}
			return nil
		case *redis.Client:
			if err := cl.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("redis unreachable: %w%s", err, tlsHint(err, cl.Options().TLSConfig == nil, cl.Options().Addr))
			}
			// A user without the INFO permission skips the check.
			if info, err := cl.Info(ctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
				return fmt.Errorf("redis: %s is a Redis Cluster node but redis.cluster is false: set redis.cluster=true (and redis.addrs), or every key in another node's slots fails with MOVED", cl.Options().Addr)
			}
			return nil
		default:
			return cl.Ping(ctx).Err()
		}
	}
}

// tlsHint explains a bare EOF or reset: a TLS-only port closes a plaintext
// connection without a word, which go-redis reports as nothing more.
func tlsHint(err error, plaintext bool, addr string) string {
	if plaintext && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		return fmt.Sprintf(" (the server closed a plaintext connection: if %s serves TLS, set redis.tls.enabled=true and redis.tls.ca_file)", addr)
	}
	return ""
}

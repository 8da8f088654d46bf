// Package enforcer is the Sluice service that turns signals into
// enforcement: it consumes sluice.signals.v1, keeps a breaker per tenant ×
// model (and tenant-wide, and per API key) — quota, rate window, error
// ratio, slow-call ratio, manual, blacklist — writes the resulting flags to
// Redis for the gateway Checkers (coalesced, with TTLs and a heartbeat), and
// serves an authenticated admin API whose every action is audited in
// ClickHouse.
//
// Its memory survives restarts without a database of its own: the flags in
// Redis are read back as the floor before anything is written, manual
// breakers, blacklists and overrides come from the compacted admin topic
// every replica reads whole, and open quota breakers from ClickHouse's
// quota_state (see recovery.go). Replicas share the work through a leader
// lease in Redis (lease.go, README.md).
package enforcer

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/kafkaconn"
)

// Config is the enforcer's section of the configuration.
type Config struct {
	// Consumer is the signals topic's (topics.signals) group; with replica_id set, each
	// replica reads in a group of its own, <group>-<replica_id>, so that
	// every replica reads every signal.
	kafkaconn.Consumer `yaml:"consumer"`
	// KeyPrefix is the flags' Redis prefix: not a setting, Run derives it
	// from redis.key_prefix (the one prefix Checkers and the enforcer
	// share); tests may set it.
	KeyPrefix       string        `yaml:"-"`
	FlushInterval   time.Duration `yaml:"flush_interval" help:"how long flag changes wait to be coalesced into one Redis round trip"`
	FlagTTL         time.Duration `yaml:"flag_ttl" help:"lifetime of a flag the enforcer stops refreshing (a dead enforcer blocks no one longer)"`
	HeartbeatEvery  time.Duration `yaml:"heartbeat_every" help:"period of the heartbeat Checkers judge staleness by"`
	TickEvery       time.Duration `yaml:"tick_every" help:"period of the clock that closes, half-opens and expires breakers"`
	MaxDirty        int           `yaml:"max_dirty" help:"tenants waiting for a flag write; beyond it one full rewrite replaces them"`
	BatchTenants    int           `yaml:"batch_tenants" help:"tenants per pipelined Redis write"`
	DedupSignals    int           `yaml:"dedup_signals" help:"signal ids remembered to drop redeliveries"`
	Recover         bool          `yaml:"recover" help:"rebuild quota breakers from ClickHouse on start"`
	ReplicaID       string        `yaml:"replica_id" help:"this replica's name, unique among enforcers sharing a redis.key_prefix: required when several run; it names the replica's own signals consumer group (consumer.group-replica_id) and its leader lease. Empty: one replica, group consumer.group, lease named by the host name"`
	LeaderLease     time.Duration `yaml:"leader_lease" help:"lease in Redis that lets one replica write flags; when the leader dies another replica takes over within it"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" help:"time allowed for the last flag write on shutdown"`
	Admin           AdminConfig   `yaml:"admin"`
}

// AdminConfig configures the admin HTTP API.
type AdminConfig struct {
	Listen      string              `yaml:"listen" help:"admin API address host:port; empty disables it"`
	Tokens      []adminapi.Token    `yaml:"tokens" help:"accepted bearer tokens (name and sha256)"`
	TLSCertFile string              `yaml:"tls_cert_file" help:"PEM certificate (chain) the admin API serves HTTPS with; with tls_key_file. Empty: plain HTTP (a warning is logged when listen is not a loopback address). Read at start: a renewed certificate takes a restart"`
	TLSKeyFile  string              `yaml:"tls_key_file" help:"PEM private key of tls_cert_file"`
	HTTP        httpserver.Timeouts `yaml:"http"`
}

// DefaultConfig returns working defaults for the services script.
func DefaultConfig() Config {
	return Config{
		// A short session: while a crashed enforcer's session lingers, a
		// restarted one reads no signals, and enforcement waits on it.
		Consumer:       kafkaconn.Consumer{Group: "sluice-enforcer", SessionTimeout: 10 * time.Second},
		FlushInterval:  5 * time.Millisecond,
		FlagTTL:        60 * time.Second,
		HeartbeatEvery: time.Second,
		TickEvery:      250 * time.Millisecond,
		MaxDirty:       100_000,
		BatchTenants:   1000,
		DedupSignals:   100_000,
		Recover:        true,
		// Well under the Checkers' default max_staleness (10s), so a
		// failover does not make them apply fail modes.
		LeaderLease:     3 * time.Second,
		ShutdownTimeout: 5 * time.Second,
		Admin:           AdminConfig{Listen: "127.0.0.1:9471", HTTP: httpserver.Defaults()},
	}
}

// Validate names each bad field and its limit.
func (c Config) Validate() error {
	var errs []error
	between := func(name string, v, lo, hi time.Duration) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("%s: %v is outside %v..%v", name, v, lo, hi))
		}
	}
	between("flush_interval", c.FlushInterval, time.Millisecond, 10*time.Second)
	between("flag_ttl", c.FlagTTL, 3*time.Second, 24*time.Hour)
	between("heartbeat_every", c.HeartbeatEvery, 50*time.Millisecond, time.Minute)
	between("tick_every", c.TickEvery, 10*time.Millisecond, time.Minute)
	between("shutdown_timeout", c.ShutdownTimeout, 100*time.Millisecond, 5*time.Minute)
	if c.HeartbeatEvery*3 > c.FlagTTL {
		errs = append(errs, fmt.Errorf("heartbeat_every: %v must be at most a third of flag_ttl (%v)", c.HeartbeatEvery, c.FlagTTL))
	}
	if err := c.Consumer.Validate("consumer"); err != nil {
		errs = append(errs, err)
	}
	between("leader_lease", c.LeaderLease, 300*time.Millisecond, time.Minute)
	if c.LeaderLease > c.FlagTTL {
		errs = append(errs, fmt.Errorf("leader_lease: %v must be at most flag_ttl (%v), or flags lapse during a failover", c.LeaderLease, c.FlagTTL))
	}
	if len(c.ReplicaID) > 200 || strings.ContainsAny(c.ReplicaID, " \t\n") {
		errs = append(errs, fmt.Errorf("replica_id: %q must be at most 200 bytes without spaces", c.ReplicaID))
	}
	if c.MaxDirty < 1 || c.MaxDirty > 10_000_000 {
		errs = append(errs, fmt.Errorf("max_dirty: %d is outside 1..10000000", c.MaxDirty))
	}
	if c.BatchTenants < 1 || c.BatchTenants > 100_000 {
		errs = append(errs, fmt.Errorf("batch_tenants: %d is outside 1..100000", c.BatchTenants))
	}
	if c.DedupSignals < 0 || c.DedupSignals > 10_000_000 {
		errs = append(errs, fmt.Errorf("dedup_signals: %d is outside 0..10000000", c.DedupSignals))
	}
	if c.Admin.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Admin.Listen); err != nil {
			errs = append(errs, fmt.Errorf("admin.listen: %q is not host:port", c.Admin.Listen))
		}
	}
	if (c.Admin.TLSCertFile == "") != (c.Admin.TLSKeyFile == "") {
		errs = append(errs, errors.New("admin.tls_cert_file, enforcer.admin.tls_key_file: set both (a PEM certificate and its key) or neither"))
	}
	if err := c.Admin.HTTP.Validate("admin.http"); err != nil {
		errs = append(errs, err)
	}
	for i, t := range c.Admin.Tokens {
		if t.Name == "" {
			errs = append(errs, fmt.Errorf("admin.tokens[%d].name: must not be empty", i))
		}
		if len(t.SHA256) != 64 {
			errs = append(errs, fmt.Errorf("admin.tokens[%d].sha256: must be 64 hex digits (printf %%s TOKEN | sha256sum)", i))
		}
		if err := t.Validate(fmt.Sprintf("admin.tokens[%d]", i)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

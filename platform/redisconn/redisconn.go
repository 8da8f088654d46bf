// Package redisconn builds the go-redis client the enforcer and the gateway
// Checker use for enforcement flags.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// Config says where Redis is.
type Config struct {
	Addr         string             `yaml:"addr" help:"Redis address host:port"`
	Username     string             `yaml:"username" help:"Redis ACL user (empty: the default user)"`
	Password     tlsconfig.Password `yaml:"password" help:"Redis password (prefer password_file or the environment; never logged)"`
	PasswordFile string             `yaml:"password_file" help:"file holding the Redis password (e.g. a mounted secret)"`
	DB           int                `yaml:"db" help:"Redis database number"`
	DialTimeout  time.Duration      `yaml:"dial_timeout" help:"timeout for one connection attempt"`
	PoolSize     int                `yaml:"pool_size" help:"connections per client"`
	TLS          tlsconfig.Config   `yaml:"tls"`
}

// Defaults points at the services script's Redis.
func Defaults() Config {
	return Config{Addr: "127.0.0.1:16379", DialTimeout: 2 * time.Second, PoolSize: 16}
}

// Validate checks the address and pool settings.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("redis.addr: %q is not host:port", c.Addr))
	}
	if c.DB < 0 || c.DB > 15 {
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

// NewClient returns a client for c. It does not connect until first use.
//
// A TLS file or password file that cannot be read (Validate reports it at
// start-up; it can still vanish afterwards) does not panic and does not
// fall back to plaintext: every command of the client fails with the error
// naming the setting, so the readiness check shows it.
func NewClient(c Config) *redis.Client {
	o, err := c.options()
	if err != nil {
		o = &redis.Options{
			Addr: c.Addr,
			Dialer: func(context.Context, string, string) (net.Conn, error) {
				return nil, fmt.Errorf("redis: %w", err)
			},
			MaxRetries: -1,
		}
	}
	return redis.NewClient(o)
}

func (c Config) options() (*redis.Options, error) {
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
	return &redis.Options{
		Addr:        c.Addr,
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

// Ready returns a readiness check that pings Redis.
func Ready(cl *redis.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := cl.Ping(ctx).Err(); err != nil {
			// A TLS-only port closes a plaintext connection without a word,
			// which go-redis reports as a bare EOF or reset: say what the
			// likely fix is.
			if cl.Options().TLSConfig == nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
				return fmt.Errorf("redis unreachable: %w (the server closed a plaintext connection: if %s serves TLS, set redis.tls.enabled=true and redis.tls.ca_file)", err, cl.Options().Addr)
			}
			return fmt.Errorf("redis unreachable: %w", err)
		}
		return nil
	}
}

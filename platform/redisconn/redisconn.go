// Package redisconn builds the go-redis client the enforcer and the gateway
// Checker use for enforcement flags.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config says where Redis is.
type Config struct {
	Addr        string        `yaml:"addr" help:"Redis address host:port"`
	Password    string        `yaml:"password" help:"Redis password"`
	DB          int           `yaml:"db" help:"Redis database number"`
	DialTimeout time.Duration `yaml:"dial_timeout" help:"timeout for one connection attempt"`
	PoolSize    int           `yaml:"pool_size" help:"connections per client"`
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
	return errors.Join(errs...)
}

// NewClient returns a client for c. It does not connect until first use.
func NewClient(c Config) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:        c.Addr,
		Password:    c.Password,
		DB:          c.DB,
		DialTimeout: c.DialTimeout,
		PoolSize:    c.PoolSize,
		// Flags must keep flowing when Redis is slow: fail fast and let the
		// caller retry rather than pile up blocked writers.
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
	})
}

// Ready returns a readiness check that pings Redis.
func Ready(cl *redis.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := cl.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis unreachable: %w", err)
		}
		return nil
	}
}

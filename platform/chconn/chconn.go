// Package chconn opens ClickHouse connections for Sluice over the native
// protocol (clickhouse-go/v2), the one protocol that works from ClickHouse
// 18.16 up to current releases.
package chconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// Config says where ClickHouse is and which database holds Sluice's tables.
type Config struct {
	Addr         string             `yaml:"addr" help:"ClickHouse native protocol address host:port"`
	Database     string             `yaml:"database" help:"database holding Sluice's tables"`
	Username     string             `yaml:"username" help:"ClickHouse user"`
	Password     tlsconfig.Password `yaml:"password" help:"ClickHouse password (prefer password_file or the environment; never logged)"`
	PasswordFile string             `yaml:"password_file" help:"file holding the ClickHouse password (e.g. a mounted secret)"`
	DialTimeout  time.Duration      `yaml:"dial_timeout" help:"timeout for one connection attempt"`
	MaxOpenConns int                `yaml:"max_open_conns" help:"connection pool size"`
	// TLS for the native protocol goes to ClickHouse's tcp_port_secure
	// (9440 by default), not to the plaintext tcp_port.
	TLS tlsconfig.Config `yaml:"tls"`
}

// Defaults points at the services script's ClickHouse.
func Defaults() Config {
	return Config{Addr: "127.0.0.1:19000", Database: "sluice", Username: "default", DialTimeout: 5 * time.Second, MaxOpenConns: 8}
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate checks the address and that the database name is a plain
// identifier (it is spliced into DDL).
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("clickhouse.addr: %q is not host:port", c.Addr))
	}
	if !identifier.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("clickhouse.database: %q must match %s", c.Database, identifier))
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, errors.New("clickhouse.dial_timeout: must be positive"))
	}
	if c.MaxOpenConns < 1 {
		errs = append(errs, errors.New("clickhouse.max_open_conns: must be at least 1"))
	}
	// Each checked apart so one start-up error lists every mistake.
	if _, err := tlsconfig.Secret("clickhouse.password", c.Password, c.PasswordFile); err != nil {
		errs = append(errs, err)
	}
	if err := c.TLS.Validate("clickhouse.tls"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c Config) options(database string) (*clickhouse.Options, error) {
	pass, err := tlsconfig.Secret("clickhouse.password", c.Password, c.PasswordFile)
	if err != nil {
		return nil, err
	}
	tc, err := c.TLS.Build("clickhouse.tls")
	if err != nil {
		return nil, err
	}
	return &clickhouse.Options{
		Addr:         []string{c.Addr},
		Protocol:     clickhouse.Native,
		Auth:         clickhouse.Auth{Database: database, Username: c.Username, Password: pass},
		TLS:          tc,
		DialTimeout:  c.DialTimeout,
		MaxOpenConns: c.MaxOpenConns,
		MaxIdleConns: c.MaxOpenConns,
		Compression:  &clickhouse.Compression{Method: clickhouse.CompressionLZ4},
	}, nil
}

// Open connects to c.Database and pings it.
func Open(ctx context.Context, c Config) (driver.Conn, error) {
	o, err := c.options(c.Database)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: %w", err)
	}
	conn, err := clickhouse.Open(o)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: open %s: %w", c.Addr, err)
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("clickhouse: ping %s database %s: %w (is it running? did `sluice migrate` run?)", c.Addr, c.Database, err)
	}
	return conn, nil
}

// EnsureDatabase creates c.Database if it does not exist.
func EnsureDatabase(ctx context.Context, c Config) error {
	o, err := c.options("default")
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	conn, err := clickhouse.Open(o)
	if err != nil {
		return fmt.Errorf("clickhouse: open %s: %w", c.Addr, err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+c.Database); err != nil {
		return fmt.Errorf("clickhouse: create database %s: %w", c.Database, err)
	}
	return nil
}

// Ready returns a readiness check that pings conn.
func Ready(conn driver.Conn) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := conn.Ping(ctx); err != nil {
			return fmt.Errorf("clickhouse unreachable: %w", err)
		}
		return nil
	}
}

// Lazy connects to ClickHouse on first use and again after a failed
// attempt, for services that must start, and keep doing their main work,
// while ClickHouse is down (the enforcer, whose enforcement comes from
// Redis and Kafka; the usage API of the gateway and ingest). It is safe
// for concurrent use.
type Lazy struct {
	cfg  Config
	mu   sync.Mutex
	conn driver.Conn
}

// NewLazy returns a Lazy connection to c.Database; nothing is dialled yet.
func NewLazy(c Config) *Lazy { return &Lazy{cfg: c} }

// Get returns the connection, opening (and pinging) it if needed.
func (l *Lazy) Get(ctx context.Context) (driver.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		return l.conn, nil
	}
	conn, err := Open(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	l.conn = conn
	return conn, nil
}

// Ready is a readiness check: ClickHouse reachable.
func (l *Lazy) Ready(ctx context.Context) error {
	conn, err := l.Get(ctx)
	if err != nil {
		return err
	}
	return Ready(conn)(ctx)
}

// Close closes the connection if one was opened.
func (l *Lazy) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
}

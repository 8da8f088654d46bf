// Package chconn opens ClickHouse connections for Sluice over the native
// protocol (clickhouse-go/v2), the one protocol that works from ClickHouse
// 18.16 up to current releases.
//
// One server (addr) is the default layout. A replicated cluster is
// clickhouse.cluster (the name in the servers' remote_servers) with the
// replicas in clickhouse.addrs: migrations then create Replicated* tables
// ON CLUSTER (migrations.LayoutOf), and every connection goes to the first
// replica in addrs that answers, so readers and writers carry on when one
// is down. docs/scaling.md ("ClickHouse cluster") has the whole contract.
package chconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// Config says where ClickHouse is and which database holds Sluice's tables.
type Config struct {
	Addr string `yaml:"addr" help:"ClickHouse native protocol address host:port (with addrs: ignored)"`
	// Addrs are several servers, replicas of one cluster: a connection
	// goes to the first that accepts it, in order.
	Addrs    []string `yaml:"addrs" help:"several ClickHouse servers host:port, comma separated (the replicas of a cluster): each new connection goes to the first that answers, in order, so Sluice carries on while one is down; replaces addr"`
	Database string   `yaml:"database" help:"database holding Sluice's tables"`
	// Cluster names the ClickHouse cluster (remote_servers) the tables are
	// replicated over; empty is the single-server layout.
	Cluster string `yaml:"cluster" help:"ClickHouse cluster (a name in the servers' remote_servers) to replicate Sluice's tables over: sluice migrate creates the database and tables on every server of addrs with Replicated engines under replication_path, and a retried insert is deduplicated across replicas (docs/scaling.md); empty: plain tables on one server"`
	// Sharded splits the tenant-keyed tables over the cluster's shards.
	Sharded bool `yaml:"sharded" help:"with cluster: the cluster has several shards; the tables keyed by tenant are created as <table>_local on every shard with a Distributed table <table> over them, sharded by tenant; prices, snapshots and the migration ledger are replicated whole to every server"`
	// ReplicationPath is the ZooKeeper path of each replicated table.
	ReplicationPath string `yaml:"replication_path" help:"with cluster: ZooKeeper path of each replicated table; {database} and {table} are filled in by Sluice (with the migration's number, so a table a later migration re-creates gets a fresh path), other macros such as {shard} by each server (its <macros>)"`
	// InsertQuorum is ClickHouse's insert_quorum for every insert.
	InsertQuorum int                `yaml:"insert_quorum" help:"with cluster: replicas that must hold an insert before ClickHouse acknowledges it (insert_quorum; 0: one). 2 keeps an acknowledged write when a replica's disk is lost, but stops writes while fewer than 2 replicas are up"`
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
	return Config{Addr: "127.0.0.1:19000", Database: "sluice", Username: "default", DialTimeout: 5 * time.Second, MaxOpenConns: 8,
		ReplicationPath: DefaultReplicationPath}
}

// DefaultReplicationPath is clickhouse.replication_path's default.
const DefaultReplicationPath = "/clickhouse/tables/{shard}/{database}/{table}"

// Servers returns the addresses connections go to, in order: Addrs, or
// Addr when Addrs is empty.
func (c Config) Servers() []string {
	if len(c.Addrs) > 0 {
		return c.Addrs
	}
	return []string{c.Addr}
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate checks the address and that the database name is a plain
// identifier (it is spliced into DDL).
func (c Config) Validate() error {
	var errs []error
	if len(c.Addrs) == 0 {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("clickhouse.addr: %q is not host:port", c.Addr))
		}
	}
	for i, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("clickhouse.addrs[%d]: %q is not host:port", i, a))
		}
	}
	if !identifier.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("clickhouse.database: %q must match %s", c.Database, identifier))
	}
	if c.Cluster != "" && !identifier.MatchString(c.Cluster) {
		errs = append(errs, fmt.Errorf("clickhouse.cluster: %q must match %s", c.Cluster, identifier))
	}
	if c.Cluster == "" && c.Sharded {
		errs = append(errs, errors.New("clickhouse.sharded: needs clickhouse.cluster, the cluster whose shards split the tables"))
	}
	if c.Cluster == "" && c.InsertQuorum > 0 {
		errs = append(errs, errors.New("clickhouse.insert_quorum: needs clickhouse.cluster (a single server has no replicas to wait for)"))
	}
	if c.InsertQuorum < 0 {
		errs = append(errs, fmt.Errorf("clickhouse.insert_quorum: %d must be 0 or more", c.InsertQuorum))
	}
	if c.Cluster != "" {
		if err := checkReplicationPath(c.ReplicationPath); err != nil {
			errs = append(errs, err)
		}
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
	var settings clickhouse.Settings
	if c.Sharded {
		settings = clickhouse.Settings{
			// An insert into a Distributed table is acknowledged once
			// every shard stored its part, not once queued on the
			// initiator's disk: the aggregator commits offsets after it.
			"insert_distributed_sync": 1,
			// The reads by tenant (tenant IN (SELECT ... FROM
			// usage_events ...)) need distributed_product_mode=local,
			// a string setting, which clickhouse-go cannot send to 18.16
			// (its protocol carries settings as numbers): it belongs in
			// the profile of Sluice's user (docs/scaling.md).
		}
	}
	if c.InsertQuorum > 0 {
		if settings == nil {
			settings = clickhouse.Settings{}
		}
		settings["insert_quorum"] = c.InsertQuorum
	}
	return &clickhouse.Options{
		Addr:             c.Servers(),
		ConnOpenStrategy: clickhouse.ConnOpenInOrder,
		Settings:         settings,
		Protocol:         clickhouse.Native,
		Auth:             clickhouse.Auth{Database: database, Username: c.Username, Password: pass},
		TLS:              tc,
		DialTimeout:      c.DialTimeout,
		MaxOpenConns:     c.MaxOpenConns,
		MaxIdleConns:     c.MaxOpenConns,
		Compression:      &clickhouse.Compression{Method: clickhouse.CompressionLZ4},
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
		return nil, fmt.Errorf("clickhouse: open %s: %w", c.servers(), err)
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("clickhouse: ping %s database %s: %w (is it running? did `sluice migrate` run?)", c.servers(), c.Database, err)
	}
	return conn, nil
}

func (c Config) servers() string { return strings.Join(c.Servers(), ",") }

// EnsureDatabase creates c.Database if it does not exist: on every server
// of c.Servers() when c.Cluster is set (the migrations are applied server
// by server too, see migrations.ApplyConfig).
func EnsureDatabase(ctx context.Context, c Config) error {
	addrs := []string{""}
	if c.Cluster != "" {
		addrs = c.Servers()
	}
	for _, a := range addrs {
		one := c
		if a != "" {
			one.Addrs, one.Addr = nil, a
		}
		if err := ensureDatabase(ctx, one); err != nil {
			return err
		}
	}
	return nil
}

func ensureDatabase(ctx context.Context, c Config) error {
	o, err := c.options("default")
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	conn, err := clickhouse.Open(o)
	if err != nil {
		return fmt.Errorf("clickhouse: open %s: %w", c.servers(), err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+c.Database); err != nil {
		return fmt.Errorf("clickhouse: create database %s on %s: %w", c.Database, c.servers(), err)
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

// replicationMacro finds the {macros} of a replication path.
var replicationMacro = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// checkReplicationPath: an absolute ZooKeeper path naming {table}, so that
// two tables never share one; with {database} too unless the operator
// keeps one database per path prefix on purpose.
func checkReplicationPath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.Contains(p, "//") {
		return fmt.Errorf("clickhouse.replication_path: %q must be an absolute ZooKeeper path (/a/b), without a trailing slash", p)
	}
	if !strings.Contains(p, "{table}") {
		return fmt.Errorf("clickhouse.replication_path: %q must contain {table}: every table needs a path of its own", p)
	}
	if strings.Contains(strings.ReplaceAll(replicationMacro.ReplaceAllString(p, ""), "{", "}"), "}") {
		return fmt.Errorf("clickhouse.replication_path: %q has an unbalanced brace", p)
	}
	return nil
}

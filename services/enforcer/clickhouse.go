package enforcer

import (
	"context"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
)

// lazyClickHouse connects to ClickHouse on first use and again after a
// failed attempt. The enforcer must start while ClickHouse is down: its
// enforcement comes from Redis and Kafka, ClickHouse only adds recovered
// quota breakers and the audit log, so refusing to start would leave
// tenants without an enforcer for the length of a ClickHouse outage.
type lazyClickHouse struct {
	cfg  chconn.Config
	mu   sync.Mutex
	conn driver.Conn
}

// get returns the connection, opening it if needed.
func (l *lazyClickHouse) get(ctx context.Context) (driver.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		return l.conn, nil
	}
	conn, err := chconn.Open(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	l.conn = conn
	return conn, nil
}

// ready is the readiness check: ClickHouse reachable.
func (l *lazyClickHouse) ready(ctx context.Context) error {
	conn, err := l.get(ctx)
	if err != nil {
		return err
	}
	return chconn.Ready(conn)(ctx)
}

// close closes the connection if one was opened.
func (l *lazyClickHouse) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
}

// Write writes an audit entry; without ClickHouse it fails, and the admin
// API refuses the action (an action that cannot be audited is not taken).
func (l *lazyClickHouse) Write(ctx context.Context, e audit.Entry) error {
	conn, err := l.get(ctx)
	if err != nil {
		return err
	}
	return audit.New(conn).Write(ctx, e)
}

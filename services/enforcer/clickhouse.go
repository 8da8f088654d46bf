package enforcer

import (
	"context"

	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
)

// lazyClickHouse connects to ClickHouse on first use and again after a
// failed attempt (chconn.Lazy). The enforcer must start while ClickHouse is
// down: its enforcement comes from Redis and Kafka, ClickHouse only adds
// recovered quota breakers and the audit log, so refusing to start would
// leave tenants without an enforcer for the length of a ClickHouse outage.
type lazyClickHouse struct{ *chconn.Lazy }

// Write writes an audit entry; without ClickHouse it fails, and the admin
// API refuses the action (an action that cannot be audited is not taken).
func (l *lazyClickHouse) Write(ctx context.Context, e audit.Entry) error {
	conn, err := l.Get(ctx)
	if err != nil {
		return err
	}
	return audit.New(conn).Write(ctx, e)
}

// ByKey reads an API key's audit trail.
func (l *lazyClickHouse) ByKey(ctx context.Context, apiKeyID string) ([]audit.Entry, error) {
	conn, err := l.Get(ctx)
	if err != nil {
		return nil, err
	}
	return audit.New(conn).ByKey(ctx, apiKeyID)
}

// ByTenant reads a tenant's (or plan's) audit trail.
func (l *lazyClickHouse) ByTenant(ctx context.Context, tenant string) ([]audit.Entry, error) {
	conn, err := l.Get(ctx)
	if err != nil {
		return nil, err
	}
	return audit.New(conn).ByTenant(ctx, tenant)
}

package enforcer

import (
	"context"
	"fmt"
	"strings"
	"time"

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

// LastUse reads when the keys of tenants were last metered since since:
// the latest usage event of each api_key_id (admin.KeyUseReader). The
// tenant condition lets ClickHouse read only those tenants' parts of the
// table (its order key starts with tenant), the time condition only the
// days since.
func (l *lazyClickHouse) LastUse(ctx context.Context, tenants []string, since time.Time) (map[string]time.Time, error) {
	conn, err := l.Get(ctx)
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, len(tenants)+1)
	for _, t := range tenants {
		args = append(args, t)
	}
	rows, err := conn.Query(ctx, `SELECT api_key_id, max(time) FROM usage_events
WHERE tenant IN (?`+strings.Repeat(", ?", len(tenants)-1)+`) AND time >= ? AND api_key_id != '' GROUP BY api_key_id`, append(args, since.UTC())...)
	if err != nil {
		return nil, fmt.Errorf("keys' last use: %w", err)
	}
	defer rows.Close()
	used := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, fmt.Errorf("keys' last use: %w", err)
		}
		used[id] = at.UTC()
	}
	return used, rows.Err()
}

// ByTenant reads a tenant's (or plan's) audit trail.
func (l *lazyClickHouse) ByTenant(ctx context.Context, tenant string) ([]audit.Entry, error) {
	conn, err := l.Get(ctx)
	if err != nil {
		return nil, err
	}
	return audit.New(conn).ByTenant(ctx, tenant)
}

package reconciler

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/reconciler/schedule"
)

// clickHouse is the Store the service uses: the prices table and the
// tenants with events, both in ClickHouse.
type clickHouse struct {
	conn driver.Conn
}

// SyncPrices copies the policy's price list into the prices table.
func (c clickHouse) SyncPrices(ctx context.Context, prices []policy.Price, now time.Time) (int, error) {
	return pricetable.Sync(ctx, c.conn, prices, now)
}

// Tenants is the package function Tenants on c's connection.
func (c clickHouse) Tenants(ctx context.Context, pol *policy.Policy, since time.Time) ([]schedule.Tenant, error) {
	return Tenants(ctx, c.conn, pol, since)
}

// Tenants lists the tenants to reconcile: every tenant the policy names
// and every tenant with events since `since` (an unnamed tenant is
// metered under the defaults, so it is audited too), each with its zone.
func Tenants(ctx context.Context, conn driver.Conn, pol *policy.Policy, since time.Time) ([]schedule.Tenant, error) {
	ids := map[string]bool{}
	for _, id := range pol.TenantIDs() {
		ids[id] = true
	}
	rows, err := conn.Query(ctx, "SELECT DISTINCT tenant FROM usage_events WHERE time >= ?", since.UTC())
	if err != nil {
		return nil, fmt.Errorf("reconciler: list tenants: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("reconciler: list tenants: %w", err)
		}
		ids[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reconciler: list tenants: %w", err)
	}
	out := make([]schedule.Tenant, 0, len(ids))
	for id := range ids {
		t := pol.Tenant(id)
		out = append(out, schedule.Tenant{ID: id, Location: t.Location, BillingDay: t.BillingDay})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

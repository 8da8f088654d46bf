package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestLimitLoweredDuringAggregatorOutageBlocksOnReturn (issue 31 item 11):
// the aggregator is stopped, a tenant's hourly limit is lowered below what
// it already used, and the aggregator comes back. Its rebuilt state has the
// tenant at 100% with no tier crossing; what it says must be announced and
// enforced: the gateway's Checker refuses the tenant within 5 s of the
// aggregator's return (before, nothing blocked it until an enforcer
// restart).
func TestLimitLoweredDuringAggregatorOutageBlocksOnReturn(t *testing.T) {
	s, g, tenant := oneTenantStack(t, "e2e-lowered-", 20000, nil, "ingest", "aggregator", "enforcer")
	const model = "gpt-4o-mini"

	g.spend(t, tenant, model, 11000)
	// Stored and committed before the stop: the restart rebuilds it from
	// ClickHouse instead of reading it again from Kafka.
	itest.EventuallyNoError(t, waitTimeout, "the tenant's use in quota_state", func() error {
		var used float64
		err := s.conn.QueryRow(context.Background(), `SELECT used FROM quota_state FINAL
			WHERE tenant = ? AND model = '*' AND quota = 'hourly_tokens' ORDER BY period_start DESC LIMIT 1`, tenant).Scan(&used)
		if err != nil || used != 11000 {
			return fmt.Errorf("used %v, %v", used, err)
		}
		return nil
	})
	s.proc("aggregator").stop()
	s.writePolicy(policyYAML(map[string]int{tenant: 10000}))
	s.start("aggregator")
	itest.EventuallyNoError(t, 5*time.Second, "the gateway's Checker refuses the tenant within 5 s of the aggregator's return", func() error {
		if d := g.checker.Check(tenant, model, "key-"+tenant); d.Allowed() {
			return fmt.Errorf("still allowed")
		}
		return nil
	})
}

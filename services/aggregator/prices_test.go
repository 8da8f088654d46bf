package aggregator_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestAggregatorKeepsPricesTableWithPolicy: the cost views price usage
// from the first event, so the aggregator (which always runs with the
// policy) copies the policy's prices into ClickHouse at start and on every
// reload, without any reconciler running.
func TestAggregatorKeepsPricesTableWithPolicy(t *testing.T) {
	e := integrationEnv(t, "")
	r := runInProcess(t, e, e.ch.Addr, nil)
	ctx := context.Background()
	price := func(model string) func() bool {
		return func() bool {
			var n uint64
			if err := e.conn.QueryRow(ctx, "SELECT count() FROM price_periods WHERE model = ?", model).Scan(&n); err != nil {
				t.Log(err)
				return false
			}
			return n == 1
		}
	}
	itest.Eventually(t, 30*time.Second, "the policy's m0 price in ClickHouse after the aggregator started", price("m0"))

	reloaded := strings.Replace(itPolicy, "prices:\n", "prices:\n  - {model: m1, currency: USD, effective_from: 2020-01-01T00:00:00Z, prompt: 1, completion: 2, cached: 0.5}\n", 1)
	if err := os.WriteFile(e.policy, []byte(reloaded), 0o644); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 30*time.Second, "the m1 price added by a policy reload in ClickHouse", price("m1"))
	// The sync is counted once its insert returned, a moment after the
	// row is visible.
	itest.Eventually(t, 30*time.Second, "sluice_price_syncs_total{result=ok} at 2 or more (start and reload)", func() bool {
		return r.metric(t, "sluice_price_syncs_total", "ok") >= 2
	})
}

package aggregator_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// TestModelsBeyondMaxModelsAreCountedAsOther: through the running service,
// a tenant with max_models 2 sending five models gets usage_minute rows for
// two models, "other" and "*" (all five counted), and the folds are
// counted in sluice_aggregator_models_capped_total.
func TestModelsBeyondMaxModelsAreCountedAsOther(t *testing.T) {
	e := integrationEnv(t, "tenants:\n  acme:\n    max_models: 2\n")
	r := runInProcess(t, e, e.ch.Addr, nil)
	at := time.Now().UTC().Truncate(time.Minute)
	var evs []schemas.UsageEvent
	for i := range 5 {
		evs = append(evs, schemas.UsageEvent{ID: fmt.Sprintf("e%d", i), Time: at, Tenant: "acme", Model: fmt.Sprintf("m%d", i), PromptTokens: 10})
	}
	produce(t, e, evs)
	itest.Eventually(t, 60*time.Second, "the folds to be counted", func() bool {
		return r.metric(t, "sluice_aggregator_models_capped_total", "") == 3
	})
	itest.Eventually(t, 60*time.Second, "usage_minute rows for m0, m1, other and *", func() bool {
		rows, err := e.conn.Query(context.Background(), "SELECT model, argMax(prompt_tokens, version) FROM usage_minute WHERE tenant = 'acme' GROUP BY model ORDER BY model")
		if err != nil {
			return false
		}
		defer rows.Close()
		got := map[string]uint64{}
		var models []string
		for rows.Next() {
			var m string
			var p uint64
			if rows.Scan(&m, &p) != nil {
				return false
			}
			got[m] = p
			models = append(models, m)
		}
		return slices.Equal(models, []string{"*", "m0", "m1", "other"}) && got["*"] == 50 && got["other"] == 30
	})
}

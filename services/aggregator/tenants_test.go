package aggregator_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controlplane/controlplanetest"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// TestTenantRecordsReachThePipelineQuotas: a tenant defined through the
// admin API (a tenant record on the admin topic, as the enforcer writes
// it) replaces the file's defaults for that tenant within 5 s: acme, at
// 100% of the defaults' 1,000 hourly tokens, goes down to tier 0 under its
// record's 10,000, with no new usage.
func TestTenantRecordsReachThePipelineQuotas(t *testing.T) {
	e, adminTopic, cl := adminTopicSetup(t)
	run := runInProcess(t, e, e.ch.Addr, nil)
	w := watchSignals(t, e)
	produce(t, e, []schemas.UsageEvent{{ID: "a1", Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 1000}})
	itest.Eventually(t, 60*time.Second, "acme at 100% of the defaults' hourly quota", w.has(tierOf("acme", 100, schemas.DirectionUp)))

	recs := controlplanetest.TenantRecords(t, testSignalAuth, adminTopic, "acme", `{"models":{"*":{"hourly_tokens":10000}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	itest.Eventually(t, 5*time.Second, "acme's tier down under its tenant record", w.has(tierOf("acme", 0, schemas.DirectionDown)))
	t.Logf("tenant record to tier signal: %s", time.Since(start))
	if n := run.metric(t, "sluice_aggregator_policy_conflicts", ""); n != 0 {
		t.Errorf("policy conflicts %v; want 0 (the file does not define acme)", n)
	}
}

package aggregator_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/adminlog"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// TestLimitLoweredDuringOutageBlocksOnReturn: what the restored state says
// is announced and enforced. With every aggregator stopped, acme's hourly
// limit is lowered below what it already used, and globex's override
// (which kept it under its limit) expires. When the aggregator returns,
// its rebuilt state has both at 100% — reached with no tier crossing,
// since the replay counted them under the new limits from the start — and
// a real enforcer must block both within 5 s of the return.
func TestLimitLoweredDuringOutageBlocksOnReturn(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	e := setup(t)
	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 20000}\n  globex:\n    models:\n      \"*\": {hourly_tokens: 10000}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	compact := "compact"
	if _, err := e.adm.CreateTopics(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, e.admin); err != nil {
		t.Fatal(err)
	}
	// globex's override, as the enforcer's admin API writes it, ends soon.
	until := time.Now().Add(8 * time.Second)
	writer := adminlog.New(itest.Signer(t, testSignalAuth).For(signalauth.AdminActions))
	recs, err := writer.Records(e.admin, &schemas.AdminState{Kind: schemas.AdminOverride, Tenant: "globex", Model: "*",
		Quota: schemas.QuotaHourlyTokens, Limit: 20000, Until: until, Actor: "test", Time: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	run := runInProcess(t, e, e.ch.Addr, nil)
	flagged := runEnforcer(t, e)
	now := time.Now().UTC()
	produce(t, e, []schemas.UsageEvent{
		{ID: "a1", Time: now, Tenant: "acme", Model: "gpt-4o", PromptTokens: 11000},
		{ID: "g1", Time: now, Tenant: "globex", Model: "gpt-4o", PromptTokens: 11000},
	})
	stored := func(tenant string, used float64) func() bool {
		return func() bool {
			var u float64
			err := e.conn.QueryRow(context.Background(), `SELECT used FROM quota_state FINAL
				WHERE tenant = ? AND model = '*' AND quota = 'hourly_tokens' ORDER BY period_start DESC LIMIT 1`, tenant).Scan(&u)
			return err == nil && u == used
		}
	}
	itest.Eventually(t, 60*time.Second, "acme's use stored", stored("acme", 11000))
	itest.Eventually(t, 60*time.Second, "globex's use stored", stored("globex", 11000))
	if flagged("acme") || flagged("globex") {
		t.Fatal("blocked before the outage")
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// The outage: a lower limit, an override running out.
	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 10000}\n  globex:\n    models:\n      \"*\": {hourly_tokens: 10000}\n")
	itest.Eventually(t, 30*time.Second, "globex's override to expire", func() bool { return time.Now().After(until) })

	runInProcess(t, e, e.ch.Addr, nil)
	produce(t, e, []schemas.UsageEvent{{ID: "a2", Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 100}})
	itest.Eventually(t, 5*time.Second, "acme blocked after the aggregator returned", func() bool { return flagged("acme") })
	itest.Eventually(t, 5*time.Second, "globex blocked after the aggregator returned", func() bool { return flagged("globex") })
}

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
// is announced, so that it is enforced. With every aggregator stopped,
// acme's hourly limit is lowered below what it already used, and globex's
// override (which kept it under its limit) expires. When the aggregator
// returns, its rebuilt state has both at 100% — reached with no tier
// crossing, since the replay counted them under the new limits from the
// start — and within 5 s of the return it must publish, for each, the hard
// quota_exhausted the enforcer blocks on (and the tier_crossed to 100 the
// alerter pages on), and quota_state must say tier 100. (The whole chain
// to the flag: e2e.)
func TestLimitLoweredDuringOutageBlocksOnReturn(t *testing.T) {
	e := integrationEnv(t, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 20000}\n  globex:\n    models:\n      \"*\": {hourly_tokens: 10000}\n")
	createAdminTopic(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
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
	w := watchSignals(t, e)
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
	exhausted := func(tenant string) func(*schemas.Signal) bool {
		return func(s *schemas.Signal) bool {
			return s.Kind == schemas.SignalQuotaExhausted && s.Tenant == tenant && s.Model == "*" && s.Quota == schemas.QuotaHourlyTokens &&
				s.Mode == schemas.ModeHard && s.Limit == 10000
		}
	}
	at100 := func(tenant string) func(*schemas.Signal) bool {
		return func(s *schemas.Signal) bool {
			return s.Kind == schemas.SignalTierCrossed && s.Tenant == tenant && s.Model == "*" && s.Quota == schemas.QuotaHourlyTokens &&
				s.Tier == 100 && s.Direction == schemas.DirectionUp
		}
	}
	if w.has(exhausted("acme"))() || w.has(exhausted("globex"))() {
		t.Fatal("exhausted before the outage")
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// The outage: a lower limit, an override running out.
	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 10000}\n  globex:\n    models:\n      \"*\": {hourly_tokens: 10000}\n")
	itest.Eventually(t, 30*time.Second, "globex's override to expire", func() bool { return time.Now().After(until) })

	runInProcess(t, e, e.ch.Addr, nil)
	produce(t, e, []schemas.UsageEvent{{ID: "a2", Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 100}})
	for _, tenant := range []string{"acme", "globex"} {
		itest.Eventually(t, 5*time.Second, tenant+"'s quota_exhausted after the aggregator returned", w.has(exhausted(tenant)))
		if !w.has(at100(tenant))() {
			t.Errorf("no tier_crossed to 100 for %s after the return", tenant)
		}
		itest.Eventually(t, 5*time.Second, tenant+"'s quota_state at tier 100 under the limit of 10000", func() bool {
			var limit float64
			var tier uint16
			err := e.conn.QueryRow(context.Background(), `SELECT quota_limit, tier FROM quota_state FINAL
				WHERE tenant = ? AND model = '*' AND quota = 'hourly_tokens' ORDER BY period_start DESC LIMIT 1`, tenant).Scan(&limit, &tier)
			return err == nil && limit == 10000 && tier == 100
		})
	}
}

package aggregator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/adminlog"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// count polls briefly and reports whether at least n signals match pred.
func (w *signalWatch) count(n int, pred func(*schemas.Signal) bool) func() bool {
	return func() bool {
		w.has(func(*schemas.Signal) bool { return false })()
		c := 0
		for i := range w.seen {
			if pred(&w.seen[i]) {
				c++
			}
		}
		return c >= n
	}
}

func tierOf(tenant string, tier int, dir schemas.Direction) func(*schemas.Signal) bool {
	return func(s *schemas.Signal) bool {
		return s.Kind == schemas.SignalTierCrossed && s.Tenant == tenant && s.Model == "*" && s.Quota == schemas.QuotaHourlyTokens && s.Tier == tier && s.Direction == dir
	}
}

// adminTopicSetup is the set-up of a test of overrides on the admin
// topic: the services (setup), a policy of 1,000 hourly tokens for every
// model, a compacted admin topic of the test's own, and a client to
// produce to it.
func adminTopicSetup(t *testing.T) (e *env, adminTopic string, cl *kgo.Client) {
	t.Helper()
	e = integrationEnv(t, "defaults:\n  models:\n    \"*\": {hourly_tokens: 1000}\n")
	adminTopic = e.admin
	cl, err := kafkaconn.NewClient(e.kafka)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	createAdminTopic(t, e)
	return e, adminTopic, cl
}

// createAdminTopic creates the test's admin topic (e.admin) compacted, as
// the enforcer's admin topic is, so that a tombstone removes a record.
func createAdminTopic(t testing.TB, e *env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	compact := "compact"
	if _, err := e.adm.CreateTopics(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, e.admin); err != nil {
		t.Fatal(err)
	}
}

// TestAdminOverridesReachTiers: quota overrides on the admin topic change
// tiers, signals and quota_state, not only flags: one written before the
// aggregator starts is in force from the first event; one written while it
// runs takes a blocked tenant's tier down at once (which resolves its
// alert); a tombstone lifts it and its expiry ends it, each re-evaluating
// the tenant at once, with no new usage.
func TestAdminOverridesReachTiers(t *testing.T) {
	e, adminTopic, cl := adminTopicSetup(t)
	// The enforcer's admin API signs what it writes (signal_auth).
	signer := itest.Signer(t, testSignalAuth).For(signalauth.AdminActions)
	encode := func(st *schemas.AdminState) []byte {
		t.Helper()
		v, err := schemas.EncodeAdminState(st)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	send := func(rec *kgo.Record) {
		t.Helper()
		rec.Topic = adminTopic
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	put := func(st *schemas.AdminState, tombstone bool) {
		t.Helper()
		var v []byte
		if !tombstone {
			v = encode(st)
		}
		send(signer.Record(adminTopic, []byte(st.Key()), v))
	}
	override := func(tenant string, limit float64, until time.Time) *schemas.AdminState {
		return &schemas.AdminState{Kind: schemas.AdminOverride, Tenant: tenant, Model: "*", Quota: schemas.QuotaHourlyTokens,
			Limit: limit, Until: until, Actor: "test", Time: time.Now().UTC()}
	}
	// Written before the aggregator starts.
	put(override("pre", 10000, time.Now().Add(time.Hour)), false)

	run := runInProcess(t, e, e.ch.Addr, nil)
	w := watchSignals(t, e)
	now := time.Now().UTC()
	produce(t, e, []schemas.UsageEvent{
		{ID: "a1", Time: now, Tenant: "acme", Model: "gpt-4o", PromptTokens: 1000},
		{ID: "p1", Time: now, Tenant: "pre", Model: "gpt-4o", PromptTokens: 1000},
	})
	itest.Eventually(t, 60*time.Second, "acme at 100% of its hourly quota", w.has(tierOf("acme", 100, schemas.DirectionUp)))
	itest.Eventually(t, 30*time.Second, "pre's quota_state at its override's limit", func() bool {
		var limit float64
		var tier uint16
		err := e.conn.QueryRow(context.Background(), `SELECT quota_limit, tier FROM quota_state FINAL
			WHERE tenant = 'pre' AND model = '*' AND quota = 'hourly_tokens' ORDER BY period_start DESC LIMIT 1`).Scan(&limit, &tier)
		return err == nil && limit == 10000 && tier == 0
	})
	if w.has(tierOf("pre", 100, schemas.DirectionUp))() {
		t.Fatal("pre crossed 100% although an override raised its limit before the aggregator started")
	}

	lift := override("acme", 10000, time.Now().Add(time.Hour))
	put(lift, false)
	itest.Eventually(t, 5*time.Second, "acme's tier down after an override, with no new usage", w.has(tierOf("acme", 0, schemas.DirectionDown)))

	// Forged records that would put acme back at its limit: a tombstone
	// lifting the override, unsigned, and an override of 1000 signed with
	// a guessed secret or carrying another record's genuine signature.
	// They are refused; the signed override behind them raises the limit
	// to 1200, which takes acme from tier 0 up to 70 — had a forgery been
	// applied, from 100 down to 70 instead.
	forger := itest.Signer(t, signalauth.Config{Keys: []string{"test:" + strings.Repeat("f", 64)}}).For(signalauth.AdminActions)
	adminSchema := []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaAdminV1)}}
	back := override("acme", 1000, time.Now().Add(time.Hour))
	send(&kgo.Record{Key: []byte(lift.Key()), Headers: adminSchema})
	send(forger.Record(adminTopic, []byte(back.Key()), encode(back)))
	send(&kgo.Record{Key: []byte(back.Key()), Value: encode(back), Headers: signer.Record(adminTopic, []byte(back.Key()), encode(lift)).Headers})
	put(override("acme", 1200, time.Now().Add(time.Hour)), false)
	itest.Eventually(t, 5*time.Second, "acme up to tier 70 under the signed override", w.has(tierOf("acme", 70, schemas.DirectionUp)))
	if w.count(2, tierOf("acme", 100, schemas.DirectionUp))() {
		t.Fatal("a forged admin record put acme back at 100%")
	}
	if n := run.metric(t, "sluice_aggregator_admin_unauthenticated_total", ""); n != 3 {
		t.Errorf("unauthenticated admin records %v, want 3", n)
	}

	put(lift, true) // tombstone: the policy's 1000 again
	itest.Eventually(t, 5*time.Second, "acme back at 100% after the override was lifted", w.count(2, tierOf("acme", 100, schemas.DirectionUp)))

	put(override("acme", 10000, time.Now().Add(2*time.Second)), false)
	itest.Eventually(t, 5*time.Second, "acme's tier down under a short override", w.count(2, tierOf("acme", 0, schemas.DirectionDown)))
	itest.Eventually(t, 10*time.Second, "acme back at 100% when the override expired", w.count(3, tierOf("acme", 100, schemas.DirectionUp)))
}

// TestReplayedAdminOverrideIsRefused: a genuine signed override copied
// back onto the admin topic after it was lifted must not raise the quota
// again. The aggregator refuses the older version and counts it: the next
// genuine override (1,200) takes acme from 100% down to tier 70, where an
// applied replay (10,000, tier 0) would have made it go up to 70.
func TestReplayedAdminOverrideIsRefused(t *testing.T) {
	e, adminTopic, cl := adminTopicSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// What the enforcer's admin API writes: each action the next version
	// of its scope, signed, under a derived key.
	writer := adminlog.New(itest.Signer(t, testSignalAuth).For(signalauth.AdminActions))
	publish := func(st *schemas.AdminState) []*kgo.Record {
		t.Helper()
		recs, err := writer.Records(adminTopic, st)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			writer.Apply(r)
		}
		return recs
	}
	override := func(limit float64) *schemas.AdminState {
		return &schemas.AdminState{Kind: schemas.AdminOverride, Tenant: "acme", Model: "*", Quota: schemas.QuotaHourlyTokens,
			Limit: limit, Until: time.Now().Add(time.Hour), Actor: "test", Time: time.Now().UTC()}
	}

	run := runInProcess(t, e, e.ch.Addr, nil)
	w := watchSignals(t, e)
	produce(t, e, []schemas.UsageEvent{{ID: "a1", Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 1000}})
	itest.Eventually(t, 60*time.Second, "acme at 100% of its hourly quota", w.has(tierOf("acme", 100, schemas.DirectionUp)))

	genuine := publish(override(10000))[0]
	itest.Eventually(t, 10*time.Second, "acme's tier down under the override", w.has(tierOf("acme", 0, schemas.DirectionDown)))
	lift := override(0)
	lift.Lifted, lift.Until = true, time.Now()
	publish(lift)
	itest.Eventually(t, 10*time.Second, "acme back at 100% once it was lifted", w.count(2, tierOf("acme", 100, schemas.DirectionUp)))

	replay := &kgo.Record{Topic: adminTopic, Key: genuine.Key, Value: genuine.Value, Headers: genuine.Headers}
	if err := cl.ProduceSync(ctx, replay).FirstErr(); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 10*time.Second, "the replay counted", func() bool { return run.metric(t, "sluice_aggregator_admin_replayed_total", "") == 1 })
	publish(override(1200))
	itest.Eventually(t, 10*time.Second, "acme at tier 70 under the 1,200 override", w.has(func(s *schemas.Signal) bool {
		return s.Kind == schemas.SignalTierCrossed && s.Tenant == "acme" && s.Model == "*" && s.Quota == schemas.QuotaHourlyTokens && s.Tier == 70
	}))
	if w.has(tierOf("acme", 70, schemas.DirectionUp))() || w.count(2, tierOf("acme", 0, schemas.DirectionDown))() {
		t.Fatal("the replayed override raised acme's quota again")
	}
}

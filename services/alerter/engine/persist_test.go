package engine

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// persistAll plays the store: it applies TakeDirty's changes to a map the
// way a compacted topic keeps the last record per key, through JSON.
func persistAll(t *testing.T, e *Engine, store map[alert.Key][]byte) {
	t.Helper()
	for _, c := range e.TakeDirty() {
		if c.Record == nil {
			delete(store, c.Key)
			continue
		}
		b, err := json.Marshal(c.Record)
		if err != nil {
			t.Fatal(err)
		}
		store[c.Key] = b
	}
}

func restoreAll(t *testing.T, e *Engine, store map[alert.Key][]byte) {
	t.Helper()
	var recs []*Record
	for _, b := range store {
		var r Record
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &r)
	}
	e.Restore(recs)
}

// TestRestoredStateNeitherRepeatsNorForgetsAlerts: an engine restored from
// what another persisted does not announce the firing alerts again, fires
// the pending one on its original schedule, escalates and resolves as the
// original would have, and deletes the records of resolved alerts.
func TestRestoredStateNeitherRepeatsNorForgetsAlerts(t *testing.T) {
	cfg := testConfig()
	cfg.ResolveAfter = 0
	e, rec := newEngine(t, cfg, nil)
	store := map[alert.Key][]byte{}
	predicted := t0.Add(5 * time.Minute)
	seq++
	exhaustion := func(at time.Time, p *time.Time) *schemas.Signal {
		seq++
		return &schemas.Signal{ID: fmt.Sprint("x", seq), Kind: schemas.SignalExhaustionPredicted, Time: at, Tenant: "acme", Model: "*",
			Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth, PeriodEnd: time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC),
			Used: 90000, Limit: 100000, Rate: 100, PredictedExhaustion: p}
	}
	e.Observe(tier("acme", 70, 90, t0), t0)
	e.Observe(exhaustion(t0, &predicted), t0)
	tickThrough(e, t0, t0.Add(time.Minute))
	e.Observe(tier("beta", 0, 70, t0.Add(time.Minute)), t0.Add(time.Minute)) // pending at the crash
	persistAll(t, e, store)
	if got := len(byChannel(rec.take(false))["dingtalk:ops"]); got != 2 {
		t.Fatalf("before the restart %d notices, want 2", got)
	}
	if len(store) != 3 {
		t.Fatalf("%d records persisted, want 3 (two firing, one pending)", len(store))
	}

	// The restart: a new engine from the records alone.
	e2, rec2 := newEngine(t, cfg, nil)
	restoreAll(t, e2, store)
	tickThrough(e2, t0.Add(70*time.Second), t0.Add(3*time.Minute))
	ds := byChannel(rec2.take(false))["dingtalk:ops"]
	if len(ds) != 1 || ds[0].Alerts[0].Key.Tenant != "beta" {
		t.Fatalf("after the restart %+v, want only beta's pending alert firing", ds)
	}

	// The exhaustion prediction stops being true: resolved, not announced.
	far := t0.Add(10 * time.Hour)
	e2.Observe(exhaustion(t0.Add(3*time.Minute), &far), t0.Add(3*time.Minute))
	e2.Tick(t0.Add(3*time.Minute + 10*time.Second))
	ds = byChannel(rec2.take(false))["dingtalk:ops"]
	if len(ds) != 1 || ds[0].Status() != alert.StatusResolved || ds[0].Alerts[0].Key.Rule != alert.RuleExhaustionPredicted {
		t.Fatalf("after the prediction cleared %+v, want one resolved exhaustion_predicted", ds)
	}
	persistAll(t, e2, store)
	for k := range store {
		if k.Rule == alert.RuleExhaustionPredicted {
			t.Errorf("the resolved alert's record %v was not deleted", k)
		}
	}
	// The quota tier escalates from the level it was notified at.
	e2.Observe(tier("acme", 90, 100, t0.Add(4*time.Minute)), t0.Add(4*time.Minute))
	tickThrough(e2, t0.Add(4*time.Minute), t0.Add(6*time.Minute))
	ds = byChannel(rec2.take(false))["dingtalk:ops"]
	if len(ds) != 1 || ds[0].Alerts[0].Tier != 100 {
		t.Fatalf("escalation %+v, want one tier 100 notice", ds)
	}
}

// TestForgetDoesNotPersistDeletions: alerts dropped at a rebalance belong
// to another replica now; persisting their deletion would erase its state.
func TestForgetDoesNotPersistDeletions(t *testing.T) {
	e, _ := newEngine(t, testConfig(), nil)
	e.Observe(tier("acme", 0, 70, t0), t0)
	e.Forget(func(string) bool { return false })
	if c := e.TakeDirty(); len(c) != 0 {
		t.Fatalf("changes after Forget: %+v", c)
	}
}

// TestHeldNotificationsSurviveARestart: a crash while notifications wait
// GroupWait must not lose them, since the alert states already say they
// were sent; restored, they go out once when the wait ends.
func TestHeldNotificationsSurviveARestart(t *testing.T) {
	cfg := testConfig()
	cfg.GroupWait = 30 * time.Second
	e, rec := newEngine(t, cfg, nil)
	store := map[alert.Key][]byte{}
	e.Observe(tier("acme", 0, 90, t0), t0)
	tickThrough(e, t0, t0.Add(time.Minute))
	persistAll(t, e, store)
	held, ok := e.TakeHeld()
	if !ok || len(held) != 1 || held[0].Channel != "dingtalk:ops" || len(held[0].Alerts) != 1 {
		t.Fatalf("held %+v, %v; want acme's notice for dingtalk:ops", held, ok)
	}
	if got := byChannel(rec.take(false))["dingtalk:ops"]; len(got) != 0 {
		t.Fatalf("sent before the wait ended: %+v", got)
	}
	b, err := json.Marshal(held)
	if err != nil {
		t.Fatal(err)
	}

	e2, rec2 := newEngine(t, cfg, nil)
	restoreAll(t, e2, store)
	var back []Held
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	e2.RestoreHeld(back)
	tickThrough(e2, t0.Add(70*time.Second), t0.Add(3*time.Minute))
	got := byChannel(rec2.take(false))["dingtalk:ops"]
	if len(got) != 1 || got[0].Alerts[0].Key.Tenant != "acme" || got[0].Alerts[0].Tier != 90 {
		t.Fatalf("after the restart %+v, want acme's tier 90 notice once", got)
	}
	if held, ok := e2.TakeHeld(); !ok || len(held) != 0 {
		t.Fatalf("after the flush TakeHeld = %+v, %v; want a change to nothing held", held, ok)
	}
}

package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// prediction is an exhaustion_predicted signal for acme's daily tokens at
// at, predicting exhaustion at predicted; clear marks it as the
// aggregator's "no longer predicted".
func prediction(at, predicted time.Time, clear bool) *schemas.Signal {
	seq++
	s := &schemas.Signal{ID: fmt.Sprint("pred", seq), Kind: schemas.SignalExhaustionPredicted, Time: at, Tenant: "acme", Model: "*",
		Quota: schemas.QuotaDailyTokens, Period: schemas.PeriodDay,
		PeriodStart: t0.Truncate(24 * time.Hour), PeriodEnd: t0.Truncate(24 * time.Hour).Add(24 * time.Hour),
		Used: 800, Limit: 1000, Unit: schemas.UnitTokens, Rate: 10, PredictedExhaustion: &predicted,
		Attributes: map[string]string{schemas.AttrPredictedEarliest: predicted.Add(-time.Minute).Format(time.RFC3339)}}
	if clear {
		s.Attributes[schemas.AttrState] = schemas.StateClear
	}
	return s
}

// notices returns the exhaustion_predicted notices delivered to the
// direct channel, as "firing"/"resolved".
func notices(rec *recorder) []alert.Status {
	var out []alert.Status
	for _, m := range byChannel(rec.take(false))["dingtalk:ops"] {
		for _, a := range m.Alerts {
			if a.Key.Rule == alert.RuleExhaustionPredicted {
				out = append(out, a.Status)
			}
		}
	}
	return out
}

// TestAClearedPredictionResolvesOnceAndStaysResolvedAcrossARestart: the
// aggregator's "no longer predicted" resolves the alert (it used to fire
// until the period ended), and an alerter restarted from its persisted
// state — replaying the signals since an earlier commit, as a crash
// before the commit does — announces nothing again.
func TestAClearedPredictionResolvesOnceAndStaysResolvedAcrossARestart(t *testing.T) {
	cfg := testConfig()
	e, rec := newEngine(t, cfg, nil)
	store := map[alert.Key][]byte{}
	on := prediction(t0, t0.Add(5*time.Minute), false)
	off := prediction(t0.Add(2*time.Minute), t0.Add(20*time.Minute), true) // e.g. an hourly period's end

	e.Observe(on, t0)
	tickThrough(e, t0, t0.Add(90*time.Second))
	if got := notices(rec); fmt.Sprint(got) != "[firing]" {
		t.Fatalf("after the prediction %v, want one firing notice", got)
	}
	e.Observe(off, off.Time)
	tickThrough(e, off.Time, off.Time.Add(cfg.ResolveAfter+10*time.Second))
	if got := notices(rec); fmt.Sprint(got) != "[resolved]" {
		t.Fatalf("after the prediction cleared %v, want one resolved notice", got)
	}
	persistAll(t, e, store)
	if len(store) != 0 {
		t.Fatalf("the resolved prediction is still persisted: %v", store)
	}

	// The restart: what was persisted, then both signals again.
	e2, rec2 := newEngine(t, cfg, nil)
	restoreAll(t, e2, store)
	later := off.Time.Add(10 * time.Minute)
	e2.Observe(on, later)
	e2.Observe(off, later)
	tickThrough(e2, later, later.Add(10*time.Minute))
	if got := notices(rec2); len(got) != 0 {
		t.Fatalf("after the restart %v, want nothing announced again", got)
	}
}

// TestAClearArrivingAfterARestartResolvesTheRestoredAlert: the alert was
// firing when the alerter restarted; the restored engine neither repeats
// it nor keeps it forever once the prediction clears.
func TestAClearArrivingAfterARestartResolvesTheRestoredAlert(t *testing.T) {
	cfg := testConfig()
	e, rec := newEngine(t, cfg, nil)
	store := map[alert.Key][]byte{}
	e.Observe(prediction(t0, t0.Add(5*time.Minute), false), t0)
	tickThrough(e, t0, t0.Add(90*time.Second))
	persistAll(t, e, store)
	if got := notices(rec); fmt.Sprint(got) != "[firing]" {
		t.Fatalf("before the restart %v, want one firing notice", got)
	}

	e2, rec2 := newEngine(t, cfg, nil)
	restoreAll(t, e2, store)
	at := t0.Add(3 * time.Minute)
	tickThrough(e2, at, at.Add(time.Minute))
	e2.Observe(prediction(at.Add(time.Minute), at.Add(20*time.Minute), true), at.Add(time.Minute))
	tickThrough(e2, at.Add(time.Minute), at.Add(time.Minute+cfg.ResolveAfter+10*time.Second))
	if got := notices(rec2); fmt.Sprint(got) != "[resolved]" {
		t.Fatalf("after the restart and the clear %v, want exactly one resolved notice", got)
	}
}

// TestAPredictionWhoseTimePassedIsCleared: a tenant that stopped sending
// gets no new signal; once its predicted time is exhaustion_critical
// behind without a quota_exhausted, the prediction did not come true and
// the alert resolves.
func TestAPredictionWhoseTimePassedIsCleared(t *testing.T) {
	cfg := testConfig()
	e, rec := newEngine(t, cfg, nil)
	predicted := t0.Add(5 * time.Minute)
	e.Observe(prediction(t0, predicted, false), t0)
	tickThrough(e, t0, predicted.Add(cfg.ExhaustionCritical-10*time.Second))
	if got := notices(rec); fmt.Sprint(got) != "[firing]" {
		t.Fatalf("up to the grace after the predicted time %v, want only the firing notice", got)
	}
	tickThrough(e, predicted.Add(cfg.ExhaustionCritical), predicted.Add(cfg.ExhaustionCritical+cfg.ResolveAfter+10*time.Second))
	if got := notices(rec); fmt.Sprint(got) != "[resolved]" {
		t.Fatalf("after the predicted time passed %v, want one resolved notice", got)
	}
}

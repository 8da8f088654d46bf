package tally

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/engine"
)

// runawayPolicy: an hourly quota a runaway burns in 90 s.
const runawayPolicy = `
tenants:
  acme:
    models:
      "*": {hourly_tokens: 500000}
`

// amRecorder is the alerter's output: the firing exhaustion_predicted
// notices, with the simulated time they left.
type amRecorder struct {
	now    *time.Time
	firing []time.Time
}

func (r *amRecorder) Deliver(_ string, m alert.Message) {
	for _, a := range m.Alerts {
		if a.Key.Rule == alert.RuleExhaustionPredicted && a.Status == alert.StatusFiring && !m.Resend {
			r.firing = append(r.firing, *r.now)
		}
	}
}

// TestRunawayIsPredictedWithinFifteenSecondsAndAlertedBeforeNinetyPercent
// drives the aggregator's state and the alerter's engine on one simulated
// clock: a tenant that uses up its 500,000-token hour in 90 s (12 calls a
// second, starting mid-minute) must get an exhaustion prediction within
// 15 s of its first call — close to the truth, the truth within its
// range — and a firing exhaustion_predicted alert before it has used 90%
// of the quota, with the alerter's default pending_for (1m) as with the
// demo's (5s).
func TestRunawayIsPredictedWithinFifteenSecondsAndAlertedBeforeNinetyPercent(t *testing.T) {
	for _, pending := range []time.Duration{5 * time.Second, time.Minute} {
		t.Run("pending_for="+pending.String(), func(t *testing.T) {
			p := New(0, DefaultOptions())
			p.SetPolicy(mustPolicy(t, runawayPolicy))
			cfg := engine.DefaultConfig()
			cfg.PendingFor, cfg.GroupWait = pending, 0
			var now time.Time
			rec := &amRecorder{now: &now}
			e, err := engine.New(cfg, func(string) engine.Route {
				return engine.Route{Channels: []string{engine.AlertmanagerChannel}, Language: "en", Location: time.UTC}
			}, rec)
			if err != nil {
				t.Fatal(err)
			}
			start := t0.Add(35 * time.Second)
			const perCall = 463 // 12 calls a second: 5,556 tokens/s, 500,000 in 90 s
			truth := start.Add(90 * time.Second)
			var first *schemas.Signal
			usedAtAlert := -1.0
			var off int64
			for sec := 0; sec < 90 && usedAtAlert < 0; sec++ {
				at := start.Add(time.Duration(sec) * time.Second)
				for i := 0; i < 12; i++ {
					off++
					p.Apply(ev(fmt.Sprint("r", off), at, perCall, 0), off)
				}
				// The alerter sees the second's signals a second later
				// (the pipeline's lag) and ticks every second.
				now = at.Add(time.Second)
				for _, s := range p.TakeSignals() {
					if s.Kind == schemas.SignalExhaustionPredicted && s.Model == "*" {
						if err := s.Validate(); err != nil {
							t.Fatal(err)
						}
						if first == nil {
							first = &s
						}
					}
					e.Observe(&s, now)
				}
				e.Tick(now)
				if len(rec.firing) > 0 {
					usedAtAlert = float64(off*perCall) / 500000
				}
			}
			if first == nil {
				t.Fatal("no exhaustion_predicted for a tenant exhausting its hour in 90 s")
			}
			if d := first.Time.Sub(start); d > 15*time.Second {
				t.Errorf("first prediction %v after the first call, want within 15s", d)
			}
			if d := first.PredictedExhaustion.Sub(truth); d < -9*time.Second || d > 9*time.Second {
				t.Errorf("predicted %v, true exhaustion %v: more than 10%% of the 90 s off", first.PredictedExhaustion, truth)
			}
			lo, hi := attrTime(t, first, schemas.AttrPredictedEarliest), attrTime(t, first, schemas.AttrPredictedLatest)
			if truth.Before(lo) || truth.After(hi) || first.Attributes[schemas.AttrPredictionBasis] != BasisRates {
				t.Errorf("range [%v, %v] (%s) does not hold the true exhaustion %v", lo, hi, first.Attributes[schemas.AttrPredictionBasis], truth)
			}
			t.Logf("predicted %v after the first call: exhaustion at +%v (true +90s), range +%v..+%v; alert fired at %.0f%% used",
				first.Time.Sub(start), first.PredictedExhaustion.Sub(start), lo.Sub(start), hi.Sub(start), 100*usedAtAlert)
			if usedAtAlert < 0 || usedAtAlert >= 0.9 {
				t.Errorf("exhaustion_predicted fired at %.0f%% used, want before 90%%", 100*usedAtAlert)
			}
			// quota_state carries the prediction and its range too.
			row := quotaRow(t, p, "*", schemas.QuotaHourlyTokens)
			if row.PredictedExhaustion.IsZero() || row.PredictedEarliest.After(row.PredictedExhaustion) ||
				row.PredictedLatest.Before(row.PredictedExhaustion) || row.PredictionBasis != BasisRates {
				t.Errorf("quota_state row %+v lacks the prediction or its range", row)
			}
		})
	}
}

// TestPredictionThatStopsHoldingIsClearedOnce: a tenant predicted to run
// out within the horizon slows to a trickle; the aggregator withdraws the
// prediction once (state=clear) and announces it again when the pace
// returns.
func TestPredictionThatStopsHoldingIsClearedOnce(t *testing.T) {
	opt := DefaultOptions()
	opt.Horizon = time.Hour
	p := New(0, opt)
	p.SetPolicy(mustPolicy(t, `
tenants:
  acme:
    models:
      "*": {daily_tokens: 1000000}
`))
	var off int64
	count := func(from time.Time, minutes int, perMin int64) (on, clear int) {
		trace(p, from, minutes, perMin, &off)
		for _, s := range kinds(p.TakeSignals(), schemas.SignalExhaustionPredicted) {
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			if s.Model != "*" {
				continue
			}
			if s.Attributes[schemas.AttrState] == schemas.StateClear {
				clear++
				if !s.PredictedExhaustion.After(s.Time.Add(opt.Horizon)) {
					t.Errorf("clear names %v, not beyond the horizon", s.PredictedExhaustion)
				}
			} else {
				on++
			}
		}
		return on, clear
	}
	// 30,000 tokens a minute: about 33 minutes left.
	if on, clear := count(t0, 5, 30000); on < 1 || clear != 0 {
		t.Fatalf("fast phase: %d predictions, %d clears; want a prediction", on, clear)
	}
	// 100 tokens a minute: days left.
	if on, clear := count(t0.Add(5*time.Minute), 10, 100); on != 0 || clear != 1 {
		t.Fatalf("slow phase: %d predictions, %d clears; want exactly one clear", on, clear)
	}
	if row := quotaRow(t, p, "*", schemas.QuotaDailyTokens); !row.PredictedExhaustion.IsZero() && row.PredictedExhaustion.Sub(t0) < 2*time.Hour {
		t.Errorf("quota_state still predicts %v after the slow-down", row.PredictedExhaustion)
	}
	if on, clear := count(t0.Add(15*time.Minute), 3, 30000); on < 1 || clear != 0 {
		t.Fatalf("fast again: %d predictions, %d clears; want it announced again", on, clear)
	}
}

// TestRunawaysMonthlyPredictionDoesNotFlap drives the demo's runaway
// through the aggregator's state: 12 calls a second of 463 tokens use up
// its 500,000-token hour in 90 s, after which the gateway refuses it and
// every refused call is a rejected event of no tokens, for 20 minutes. Its
// 5,000,000-token month is predicted to run out within the first 15 s (the
// demo's promise); after that the forecast swings as the pace collapses —
// which sent four exhaustion_predicted signals for the month within 30 s,
// each a console line and an alert update. A change is news only when it
// leaves the announced prediction's uncertainty and holds
// (predictionDwell): no two signals for the month come within a minute of
// each other, and a withdrawn prediction is not announced again while the
// tenant stays blocked.
func TestRunawaysMonthlyPredictionDoesNotFlap(t *testing.T) {
	p := New(0, DefaultOptions())
	p.SetPolicy(mustPolicy(t, `
tenants:
  acme:
    models:
      "*": {hourly_tokens: 500000, monthly_tokens: 5000000}
`))
	start := t0.Add(35 * time.Second)
	var off, used int64
	var monthly []schemas.Signal
	for sec := 0; sec < 20*60; sec++ {
		at := start.Add(time.Duration(sec) * time.Second)
		for range 12 {
			off++
			call := ev(fmt.Sprint("r", off), at, 463, 0)
			if used >= 500000 {
				call.PromptTokens, call.Outcome = 0, schemas.OutcomeRejected
			}
			used += call.PromptTokens
			p.Apply(call, off)
		}
		p.SetClock(at)
		for _, s := range p.TakeSignals() {
			if s.Kind == schemas.SignalExhaustionPredicted && s.Model == "*" && s.Quota == schemas.QuotaMonthlyTokens {
				if err := s.Validate(); err != nil {
					t.Fatal(err)
				}
				monthly = append(monthly, s)
			}
		}
	}
	var lines []string
	for _, s := range monthly {
		lines = append(lines, fmt.Sprintf("+%v %s %v", s.Time.Sub(start), s.Attributes[schemas.AttrState], s.PredictedExhaustion.Sub(s.Time)))
	}
	t.Logf("monthly predictions: %q", lines)
	if len(monthly) == 0 || monthly[0].Time.Sub(start) > 15*time.Second {
		t.Fatalf("the month is not predicted within 15 s of the runaway's first call: %q", lines)
	}
	cleared := false
	for i, s := range monthly {
		if i > 0 && s.Time.Sub(monthly[i-1].Time) < time.Minute {
			t.Errorf("monthly prediction changed twice within a minute: %q", lines)
		}
		if s.Attributes[schemas.AttrState] == schemas.StateClear {
			cleared = true
		} else if cleared {
			t.Errorf("a withdrawn prediction announced again while the tenant stays blocked: %q", lines)
		}
	}
}

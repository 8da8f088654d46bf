package tally

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// runawayPolicy: an hourly quota a runaway burns in 90 s.
const runawayPolicy = `
tenants:
  acme:
    models:
      "*": {hourly_tokens: 500000}
`

// runawayGolden is the runaway's signals second by second, for the
// alerter's test that replays them (services/alerter/engine: it must fire
// exhaustion_predicted before 90% of the quota is used). The file lives
// with the signal contracts so that neither service imports the other.
const runawayGolden = "../../../../schemas/testdata/runaway-signals.json"

var update = flag.Bool("update", false, "rewrite "+runawayGolden+" from the aggregator's state")

// runawayStep is one second of the runaway: the signals the alerter sees
// at Now, and the share of the quota used by then.
type runawayStep struct {
	Now     time.Time        `json:"now"`
	Used    float64          `json:"used"`
	Signals []schemas.Signal `json:"signals,omitempty"`
}

// TestRunawayIsPredictedWithinFifteenSeconds drives the aggregator's state
// on a simulated clock: a tenant that uses up its 500,000-token hour in
// 90 s (12 calls a second, starting mid-minute) must get an exhaustion
// prediction within 15 s of its first call — close to the truth, the
// truth within its range — also in quota_state. The signals of each
// second, as the alerter sees them a second later, are the golden file
// the alerter's engine test replays (run with -update when a change to
// the forecast is meant).
func TestRunawayIsPredictedWithinFifteenSeconds(t *testing.T) {
	p := partUnder(t, DefaultOptions(), runawayPolicy)
	start := t0.Add(35 * time.Second)
	const perCall = 463 // 12 calls a second: 5,556 tokens/s, 500,000 in 90 s
	truth := start.Add(90 * time.Second)
	var first *schemas.Signal
	var steps []runawayStep
	var off int64
	for sec := 0; sec < 90; sec++ {
		at := start.Add(time.Duration(sec) * time.Second)
		for range 12 {
			off++
			p.Apply(ev(fmt.Sprint("r", off), at, perCall, 0), off)
		}
		// The alerter sees the second's signals a second later (the
		// pipeline's lag) and ticks every second.
		// TakeSignals hands out its buffer, reused by the next flush: copied.
		step := runawayStep{Now: at.Add(time.Second), Used: float64(off*perCall) / 500000, Signals: slices.Clone(p.TakeSignals())}
		for i := range step.Signals {
			s := &step.Signals[i]
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			if s.Kind == schemas.SignalExhaustionPredicted && s.Model == "*" && first == nil {
				first = s
			}
		}
		steps = append(steps, step)
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
	row := quotaRow(t, p, "*", schemas.QuotaHourlyTokens)
	if row.PredictedExhaustion.IsZero() || row.PredictedEarliest.After(row.PredictedExhaustion) ||
		row.PredictedLatest.Before(row.PredictedExhaustion) || row.PredictionBasis != BasisRates {
		t.Errorf("quota_state row %+v lacks the prediction or its range", row)
	}
	got, err := json.MarshalIndent(steps, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(runawayGolden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(runawayGolden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not the signals the aggregator now gives (run with -update if the change is meant; the alerter's engine test replays it)", runawayGolden)
	}
}

// TestPredictionThatStopsHoldingIsClearedOnce: a tenant predicted to run
// out within the horizon slows to a trickle; the aggregator withdraws the
// prediction once (state=clear) and announces it again when the pace
// returns.
func TestPredictionThatStopsHoldingIsClearedOnce(t *testing.T) {
	opt := DefaultOptions()
	opt.Horizon = time.Hour
	p := partUnder(t, opt, `
tenants:
  acme:
    models:
      "*": {daily_tokens: 1000000}
`)
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
	p := partUnder(t, DefaultOptions(), `
tenants:
  acme:
    models:
      "*": {hourly_tokens: 500000, monthly_tokens: 5000000}
`)
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

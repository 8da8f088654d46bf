package tally

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

const breakerPolicy = `
tenants:
  acme:
    breakers:
      error_ratio: {threshold: 0.5, min_requests: 10, window: 1m}
      slow_call:   {threshold: 0.5, slow_call_ms: 2000, min_requests: 10, window: 1m}
`

// anomalies returns the anomaly signals of detector for model, as
// "state@window start" strings, checking every one against the contract
// the enforcer and the alerter consume.
func anomalies(t *testing.T, sigs []schemas.Signal, detector, model string) []string {
	t.Helper()
	var out []string
	for _, s := range kinds(sigs, schemas.SignalAnomaly) {
		if s.Attributes["detector"] != detector || s.Model != model {
			continue
		}
		if err := s.Validate(); err != nil {
			t.Errorf("invalid anomaly signal %+v: %v", s, err)
		}
		a := s.Attributes
		if a["type"] != detector || (a["state"] != "firing" && a["state"] != "resolved") {
			t.Errorf("anomaly attributes %v: want type=%s and state firing|resolved", a, detector)
		}
		if _, err := strconv.ParseFloat(a["ratio"], 64); err != nil {
			t.Errorf("ratio %q is not a number", a["ratio"])
		}
		if _, err := strconv.Atoi(a["requests"]); err != nil {
			t.Errorf("requests %q is not an integer", a["requests"])
		}
		if _, err := strconv.ParseFloat(a["threshold"], 64); err != nil {
			t.Errorf("threshold %q is not a number", a["threshold"])
		}
		if wantBreaker := detector != DetectorRateSpike; (a["breaker"] == detector) != wantBreaker {
			t.Errorf("breaker attribute %q for detector %s", a["breaker"], detector)
		}
		out = append(out, a["state"]+"@"+s.PeriodStart.Format("15:04"))
	}
	return out
}

func call(id string, at time.Time, outcome schemas.Outcome, latency int64) *schemas.UsageEvent {
	e := ev(id, at, 10, 10)
	e.Outcome, e.LatencyMS = outcome, latency
	return e
}

// TestErrorRatioFiresOncePerWindowAndResolves: the error-ratio breaker
// input fires when a window reaches min_requests at the threshold, fires
// again in each following window where the condition persists (so the
// enforcer can re-judge a half-open breaker), and resolves once a window
// closes healthy.
func TestErrorRatioFiresOncePerWindowAndResolves(t *testing.T) {
	p := partUnder(t, DefaultOptions(), breakerPolicy)
	var sigs []schemas.Signal
	off := int64(0)
	send := func(minute, n, errs int) {
		for i := 0; i < n; i++ {
			o := schemas.OutcomeOK
			if i < errs {
				o = schemas.OutcomeError
			}
			off++
			p.Apply(call(fmt.Sprintf("c%d", off), t0.Add(time.Duration(minute)*time.Minute+time.Duration(i)*time.Second), o, 100), off)
			sigs = append(sigs, p.TakeSignals()...)
		}
	}
	send(0, 20, 2)  // healthy
	send(1, 20, 15) // 75% errors: fires once the 10th call is in
	send(2, 20, 12) // still bad: a fresh firing for this window
	send(3, 20, 1)  // healthy again
	send(4, 20, 0)  // closes minute 3: resolved
	got := anomalies(t, sigs, DetectorErrorRatio, "gpt-4o")
	want := []string{"firing@03:01", "firing@03:02", "resolved@03:03"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("error_ratio signals %v, want %v", got, want)
	}
	if fmt.Sprint(anomalies(t, sigs, DetectorErrorRatio, "*")) != fmt.Sprint(want) {
		t.Errorf("the tenant-wide series must follow the same calls")
	}
	// The first firing signal carries what the enforcer checks: ratio >=
	// threshold over at least min_requests calls.
	for _, s := range kinds(sigs, schemas.SignalAnomaly) {
		if s.Attributes["state"] != "firing" {
			continue
		}
		ratio, _ := strconv.ParseFloat(s.Attributes["ratio"], 64)
		n, _ := strconv.Atoi(s.Attributes["requests"])
		if ratio < 0.5 || n < 10 || s.Attributes["threshold"] != "0.5" {
			t.Errorf("firing signal with ratio %v over %d calls: below what it claims", ratio, n)
		}
	}
	if len(sigs) != len(kinds(sigs, schemas.SignalAnomaly)) {
		t.Errorf("no quotas in this policy, yet non-anomaly signals: %+v", sigs)
	}
}

// TestSlowCallUsesPolicyThresholdAndGapResolves: slow means latency at or
// above the tenant's slow_call_ms; a condition followed by silence resolves
// when the next call shows an empty window in between.
func TestSlowCallUsesPolicyThresholdAndGapResolves(t *testing.T) {
	p := partUnder(t, DefaultOptions(), breakerPolicy) // Options.SlowCallMS (10s) is for rollups only
	for i := 0; i < 12; i++ {
		p.Apply(call(fmt.Sprintf("s%d", i), t0.Add(time.Duration(i)*time.Second), schemas.OutcomeOK, 2000), int64(i))
	}
	p.Apply(call("later", t0.Add(10*time.Minute), schemas.OutcomeOK, 50), 100)
	sigs := p.TakeSignals()
	got := anomalies(t, sigs, DetectorSlowCall, "gpt-4o")
	if fmt.Sprint(got) != "[firing@03:00 resolved@03:01]" {
		t.Fatalf("slow_call signals %v, want a firing for 03:00 and a resolve for the empty 03:01 window", got)
	}
	if n := len(anomalies(t, sigs, DetectorErrorRatio, "gpt-4o")); n != 0 {
		t.Errorf("slow successful calls raised %d error_ratio signals", n)
	}
}

// TestEstimatesRejectedAndLateCallsDoNotCount: only settled calls that
// reached the upstream, in the current window, feed the breakers.
func TestEstimatesRejectedAndLateCallsDoNotCount(t *testing.T) {
	p := partUnder(t, DefaultOptions(), breakerPolicy)
	p.Apply(call("now", t0.Add(5*time.Minute), schemas.OutcomeOK, 10), 0)
	for i := 0; i < 30; i++ {
		at := t0.Add(5*time.Minute + time.Duration(i)*time.Second)
		est := call(fmt.Sprintf("est%d", i), at, schemas.OutcomeError, 10)
		est.Estimated = true
		p.Apply(est, int64(1+3*i))
		p.Apply(call(fmt.Sprintf("rej%d", i), at, schemas.OutcomeRejected, 10), int64(2+3*i))
		p.Apply(call(fmt.Sprintf("late%d", i), t0.Add(time.Duration(i)*time.Second), schemas.OutcomeError, 10), int64(3+3*i))
	}
	if got := kinds(p.TakeSignals(), schemas.SignalAnomaly); len(got) != 0 {
		t.Fatalf("estimates, rejected and late calls raised anomalies: %+v", got)
	}
	// Settling the estimates as errors does count them.
	for i := 0; i < 30; i++ {
		p.Apply(call(fmt.Sprintf("est%d", i), t0.Add(5*time.Minute+time.Duration(i)*time.Second), schemas.OutcomeError, 10), int64(100+i))
	}
	if got := anomalies(t, p.TakeSignals(), DetectorErrorRatio, "gpt-4o"); fmt.Sprint(got) != "[firing@03:05]" {
		t.Fatalf("settled errors: %v, want one firing", got)
	}
}

// TestRateSpike: a minute far above the hour's baseline fires once, the
// next ordinary minute resolves it; a new tenant's first busy minutes and
// small absolute jumps are not spikes.
func TestRateSpike(t *testing.T) {
	opt := DefaultOptions()
	opt.SpikeMinTokens = 5000
	p := partUnder(t, opt, "tenants: {}")
	off := int64(0)
	minute := func(m int, tokens int64) {
		for i := 0; i < 10; i++ {
			off++
			p.Apply(ev(fmt.Sprintf("r%d", off), t0.Add(time.Duration(m)*time.Minute+time.Duration(i)*5*time.Second), tokens/10, 0), off)
		}
	}
	minute(0, 100_000) // first minute ever: no baseline, no spike
	for m := 1; m < 30; m++ {
		minute(m, 1000)
	}
	if got := kinds(p.TakeSignals(), schemas.SignalAnomaly); len(got) != 0 {
		t.Fatalf("warm-up raised anomalies: %+v", got)
	}
	minute(30, 60_000) // far above the baseline (~4,000/min after the first minute)
	minute(31, 1000)
	minute(32, 1000)
	sigs := p.TakeSignals()
	got := anomalies(t, sigs, DetectorRateSpike, "gpt-4o")
	if fmt.Sprint(got) != "[firing@03:30 resolved@03:31]" {
		t.Fatalf("rate_spike signals %v, want a firing for minute 03:30 and a resolve naming the ordinary minute 03:31", got)
	}
	for _, s := range kinds(sigs, schemas.SignalAnomaly) {
		if s.Attributes["state"] == "firing" && s.Model == "gpt-4o" {
			ratio, _ := strconv.ParseFloat(s.Attributes["ratio"], 64)
			if ratio <= 10 || !strings.Contains(s.Reason, "baseline") {
				t.Errorf("firing spike ratio %v (reason %q), want above the multiplier 10", ratio, s.Reason)
			}
		}
	}
	// A tenant at 100 tokens/min jumping to 4,000 is 40x but under the
	// minimum volume.
	q := New(0, opt)
	q.SetPolicy(p.pol)
	off = 0
	for m := 0; m < 30; m++ {
		for i := 0; i < 2; i++ {
			off++
			q.Apply(ev(fmt.Sprintf("q%d", off), t0.Add(time.Duration(m)*time.Minute+time.Duration(i)*time.Second), 50, 0), off)
		}
	}
	q.Apply(ev("big", t0.Add(30*time.Minute), 4000, 0), 1000)
	if got := kinds(q.TakeSignals(), schemas.SignalAnomaly); len(got) != 0 {
		t.Fatalf("a jump under spike_min_tokens raised %+v", got)
	}
}

// probes returns the probe verdicts among sigs for detector and model, as
// "verdict@hh:mm:ss" strings, checking the fields the enforcer reads.
func probes(t *testing.T, sigs []schemas.Signal, detector, model string) []string {
	t.Helper()
	var out []string
	for _, s := range kinds(sigs, schemas.SignalAnomaly) {
		a := s.Attributes
		if a["probe"] == "" || a["detector"] != detector || s.Model != model {
			continue
		}
		if err := s.Validate(); err != nil {
			t.Errorf("invalid probe signal %+v: %v", s, err)
		}
		if a["breaker"] != detector || (a["probe"] == "failed") != (a["state"] == "firing") || s.PeriodEnd.Sub(s.PeriodStart) != time.Minute {
			t.Errorf("probe signal %+v: want breaker=%s, firing exactly when failed, the 1m window as its period", s, detector)
		}
		out = append(out, a["probe"]+"@"+s.Time.Format("15:04:05"))
	}
	return out
}

// TestProbesDecideWithoutMinRequests: two gateways' probes (5 each, far
// below min_requests 10) are judged one by one: the first failed one
// emits probe=failed at once (one per second at most), five successful
// ones in a row emit probe=passed, a failure in between starts the count
// again, and an abandoned probe (no outcome) counts for nothing. Events
// without the attribute are no probes.
func TestProbesDecideWithoutMinRequests(t *testing.T) {
	p := partUnder(t, DefaultOptions(), breakerPolicy)
	var sigs []schemas.Signal
	off := int64(0)
	send := func(at time.Duration, o schemas.Outcome, probe bool) {
		off++
		e := call(fmt.Sprintf("p%d", off), t0.Add(at), o, 100)
		if probe {
			e.Attributes = map[string]string{flags.ProbeAttribute: "error_ratio"}
		}
		p.Apply(e, off)
		sigs = append(sigs, p.TakeSignals()...)
	}
	send(0, schemas.OutcomeError, false) // not a probe
	send(time.Second, schemas.OutcomeOK, true)
	send(2*time.Second, schemas.OutcomeError, true)   // gateway A's probe fails
	send(2*time.Second, schemas.OutcomeError, true)   // gateway B's, same second: no second signal
	send(3*time.Second, schemas.OutcomeTimeout, true) // another second: another
	for i := range 4 {
		send(time.Duration(40+i)*time.Second, schemas.OutcomeOK, true)
	}
	send(44*time.Second, "", true) // abandoned by its client
	send(45*time.Second, schemas.OutcomeOK, true)
	got := probes(t, sigs, DetectorErrorRatio, "gpt-4o")
	want := []string{"failed@03:00:02", "failed@03:00:03", "passed@03:00:45"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("probe verdicts %v, want %v", got, want)
	}
	if fmt.Sprint(probes(t, sigs, DetectorErrorRatio, "*")) != fmt.Sprint(want) {
		t.Errorf("the tenant-wide series must judge the same probes")
	}
	// Successes more than a window apart belong to different rounds.
	send(2*time.Minute, schemas.OutcomeOK, true)
	for i := range 4 {
		send(4*time.Minute+time.Duration(i)*time.Second, schemas.OutcomeOK, true)
	}
	if got := probes(t, sigs, DetectorErrorRatio, "gpt-4o"); len(got) != 3 {
		t.Fatalf("probe verdicts %v: successes of an earlier round were counted", got)
	}
}

package tally

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

const testPolicy = `
defaults:
  timezone: UTC
  alert_tiers: [70, 90, 100]
tenants:
  acme:
    timezone: Asia/Shanghai
    budget: {amount: 10, currency: USD}
    models:
      "*":
        monthly_tokens: 1000000
        daily_tokens: 10000
        hourly_tokens: 5000
        tokens_per_minute: 3000
        requests_per_minute: 100
      gpt-4o:
        monthly_tokens: 2000
        mode: soft
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
  - {model: gpt-4o, currency: USD, effective_from: 2026-03-01T00:00:00Z, prompt: 5, completion: 20, cached: 2.5}
`

func mustPolicy(t testing.TB, y string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(y), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// partUnder returns a partition with opt under the policy y, which must
// parse.
func partUnder(t testing.TB, opt Options, y string) *Partition {
	t.Helper()
	p := New(0, opt)
	p.SetPolicy(mustPolicy(t, y))
	return p
}

// newPart returns a partition with the default options under testPolicy.
func newPart(t testing.TB) *Partition { return partUnder(t, DefaultOptions(), testPolicy) }

var t0 = time.Date(2026, 2, 10, 3, 0, 0, 0, time.UTC) // 11:00 in Shanghai

func ev(id string, at time.Time, prompt, completion int64) *schemas.UsageEvent {
	return &schemas.UsageEvent{ID: id, Time: at, Tenant: "acme", Model: "gpt-4o", PromptTokens: prompt, CompletionTokens: completion}
}

func totals(t *testing.T, p *Partition, model, period string) int64 {
	t.Helper()
	tok, _, _, _, ok := p.Totals("acme", model, period)
	if !ok {
		t.Fatalf("no %s totals for acme/%s", period, model)
	}
	return tok
}

func kinds(sigs []schemas.Signal, kind schemas.SignalKind) []schemas.Signal {
	var out []schemas.Signal
	for _, s := range sigs {
		if s.Kind == kind {
			out = append(out, s)
		}
	}
	return out
}

func TestDuplicatesCountOnceAndSettlementReplacesEstimate(t *testing.T) {
	p := newPart(t)
	if r := p.Apply(ev("a", t0, 100, 50), 0); r != Accepted {
		t.Fatalf("first event: %v", r)
	}
	if r := p.Apply(ev("a", t0, 100, 50), 1); r != Duplicate {
		t.Fatalf("retry: got %v, want Duplicate", r)
	}
	est := ev("b", t0, 1000, 1000)
	est.Estimated = true
	p.Apply(est, 2)
	if got := totals(t, p, "gpt-4o", "day"); got != 2150 {
		t.Fatalf("with estimate: day tokens %d, want 2150", got)
	}
	settle := ev("b", t0, 300, 200)
	if r := p.Apply(settle, 3); r != Accepted {
		t.Fatalf("settlement: got %v, want Accepted", r)
	}
	if r := p.Apply(est, 4); r != Duplicate {
		t.Fatalf("a late retry of the estimate after settlement must be a duplicate, got %v", r)
	}
	for _, per := range []string{"hour", "day", "month"} {
		if got := totals(t, p, "gpt-4o", per); got != 650 {
			t.Errorf("%s tokens %d, want 650 (150 + settled 500)", per, got)
		}
		if got := totals(t, p, "*", per); got != 650 {
			t.Errorf("tenant-wide %s tokens %d, want 650", per, got)
		}
	}
	if _, req, _, _, _ := p.Totals("acme", "*", "day"); req != 2 {
		t.Errorf("requests %d, want 2 distinct ids", req)
	}
	if p.Stats.Duplicates != 2 || p.Stats.Settled != 1 {
		t.Errorf("stats %+v", p.Stats)
	}
}

func TestPeriodsFollowTenantTimeZone(t *testing.T) {
	p := newPart(t)
	// 15:59 UTC is 23:59 in Shanghai; 16:00 UTC is the next local day.
	p.Apply(ev("a", time.Date(2026, 2, 10, 15, 59, 0, 0, time.UTC), 10, 0), 0)
	_, _, _, dayStart, _ := p.Totals("acme", "*", "day")
	if want := time.Date(2026, 2, 9, 16, 0, 0, 0, time.UTC); !dayStart.Equal(want) {
		t.Fatalf("day starts %v, want %v (local midnight in Asia/Shanghai)", dayStart, want)
	}
	p.Apply(ev("b", time.Date(2026, 2, 10, 16, 0, 0, 0, time.UTC), 20, 0), 1)
	if got := totals(t, p, "*", "day"); got != 20 {
		t.Errorf("new local day: %d tokens, want 20", got)
	}
	if got := totals(t, p, "*", "month"); got != 30 {
		t.Errorf("month: %d tokens, want 30", got)
	}
	// Month boundary: 2026-02-28 16:00 UTC is March 1st in Shanghai.
	p.Apply(ev("c", time.Date(2026, 2, 28, 16, 0, 0, 0, time.UTC), 5, 0), 2)
	_, _, _, monthStart, _ := p.Totals("acme", "*", "month")
	if want := time.Date(2026, 2, 28, 16, 0, 0, 0, time.UTC); !monthStart.Equal(want) || totals(t, p, "*", "month") != 5 {
		t.Errorf("month starts %v with %d tokens, want %v with 5", monthStart, totals(t, p, "*", "month"), want)
	}
}

func TestTiersCrossOnceEachWayWithHysteresis(t *testing.T) {
	p := newPart(t)
	// gpt-4o monthly_tokens 2000: 70% = 1400, 90% = 1800.
	p.Apply(ev("a", t0, 1000, 0), 0)
	p.Apply(ev("b", t0.Add(time.Second), 450, 0), 1) // 1450: 72.5%
	up := kinds(p.TakeSignals(), schemas.SignalTierCrossed)
	var model []schemas.Signal
	for _, s := range up {
		if s.Model == "gpt-4o" {
			model = append(model, s)
		}
	}
	if len(model) != 1 || model[0].Tier != 70 || model[0].Direction != schemas.DirectionUp || model[0].PreviousTier != 0 {
		t.Fatalf("want one tier_crossed up to 70 for gpt-4o, got %+v", model)
	}
	// Oscillate around 70% with estimates settled up and down: 1350..1450.
	for i := 0; i < 10; i++ {
		e := ev(fmt.Sprintf("osc%d", i), t0.Add(time.Duration(2+i)*time.Second), 40, 0)
		e.Estimated = true
		p.Apply(e, int64(10+2*i))
		p.Apply(ev(fmt.Sprintf("osc%d", i), e.Time, 0, 0), int64(11+2*i))
	}
	if got := kinds(p.TakeSignals(), schemas.SignalTierCrossed); len(got) != 0 {
		t.Fatalf("usage wobbling within the hysteresis band emitted %d tier signals: %+v", len(got), got)
	}
	// Settle "b" much lower: 1000 + 100 = 55% < 70 - 5 → down.
	bEst := ev("c", t0.Add(time.Minute), 500, 0)
	bEst.Estimated = true
	p.Apply(bEst, 40) // 1950: 97.5% → 90
	p.Apply(ev("c", bEst.Time, 0, 0), 41)
	sigs := kinds(p.TakeSignals(), schemas.SignalTierCrossed)
	var dirs []string
	for _, s := range sigs {
		if s.Model == "gpt-4o" {
			dirs = append(dirs, fmt.Sprintf("%s:%d->%d", s.Direction, s.PreviousTier, s.Tier))
		}
	}
	if fmt.Sprint(dirs) != "[up:70->90 down:90->70]" {
		t.Fatalf("crossings %v, want [up:70->90 down:90->70]", dirs)
	}
	for _, s := range sigs {
		if err := s.Validate(); err != nil {
			t.Errorf("invalid signal %+v: %v", s, err)
		}
	}
}

func TestExhaustionAndPeriodReset(t *testing.T) {
	p := newPart(t)
	p.Apply(ev("a", t0, 2100, 0), 0) // over gpt-4o's monthly 2000 and acme's hourly 5000? no: 2100 < 5000
	sigs := p.TakeSignals()
	ex := kinds(sigs, schemas.SignalQuotaExhausted)
	if len(ex) != 1 || ex[0].Quota != schemas.QuotaMonthlyTokens || ex[0].Mode != schemas.ModeSoft {
		t.Fatalf("want one soft monthly quota_exhausted, got %+v", ex)
	}
	// Next local hour: hourly quotas reset; next local month: monthly ones.
	p.Apply(ev("b", t0.Add(time.Hour), 1, 0), 1)
	resets := kinds(p.TakeSignals(), schemas.SignalPeriodReset)
	if len(resets) != 1 || resets[0].Quota != schemas.QuotaHourlyTokens || resets[0].Model != "*" {
		t.Fatalf("hour rollover: want one period_reset for acme/* hourly_tokens, got %+v", resets)
	}
	p.Apply(ev("c", time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC), 1, 0), 2)
	var names []string
	for _, s := range kinds(p.TakeSignals(), schemas.SignalPeriodReset) {
		names = append(names, s.Model+"/"+string(s.Quota))
		if err := s.Validate(); err != nil {
			t.Error(err)
		}
	}
	want := "[*/hourly_tokens */daily_tokens */monthly_tokens */budget gpt-4o/monthly_tokens]"
	if fmt.Sprint(names) != want {
		t.Errorf("month rollover resets %v, want %v", names, want)
	}
}

func TestLateEventCountedInItsOwnPeriod(t *testing.T) {
	p := newPart(t)
	p.Apply(ev("a", t0, 100, 0), 0)
	p.Apply(ev("b", t0.Add(2*time.Hour), 10, 0), 1)
	p.TakeSignals()
	if r := p.Apply(ev("late", t0.Add(30*time.Minute), 7, 0), 2); r != Accepted {
		t.Fatalf("late event: %v", r)
	}
	if got := totals(t, p, "*", "hour"); got != 10 {
		t.Errorf("current hour %d tokens, want 10: a late event must not land in the current period", got)
	}
	if got := totals(t, p, "*", "day"); got != 117 {
		t.Errorf("day %d tokens, want 117 (same local day)", got)
	}
	late := kinds(p.TakeSignals(), schemas.SignalLateEvent)
	if len(late) != 1 || late[0].Model != "gpt-4o" || p.Stats.Late != 1 {
		t.Fatalf("want one late_event for acme/gpt-4o, got %+v, stats %+v", late, p.Stats)
	}
	if err := late[0].Validate(); err != nil {
		t.Error(err)
	}
	if want := time.Date(2026, 2, 10, 3, 0, 0, 0, time.UTC); !late[0].PeriodStart.Equal(want) {
		t.Errorf("late_event period %v, want %v", late[0].PeriodStart, want)
	}
	// The closed hour's quota row is rewritten with the late tokens.
	var rows Rows
	p.Drain(&rows)
	var used float64 = -1
	for _, q := range rows.Quotas {
		if q.Model == "*" && q.Quota == "hourly_tokens" && q.PeriodStart.Equal(t0) {
			used = q.Used
		}
	}
	if used != 107 {
		t.Errorf("closed hour's quota_state used = %v, want 107 (100 + late 7)", used)
	}
}

func TestCostUsesPriceInForce(t *testing.T) {
	p := newPart(t)
	e := ev("a", t0, 1_000_000, 1_000_000)
	e.CachedTokens = 400_000
	p.Apply(e, 0)
	_, _, cost, _, _ := p.Totals("acme", "gpt-4o", "day")
	want := 0.6*2.5 + 0.4*1.25 + 10
	if math.Abs(cost-want) > 1e-9 {
		t.Errorf("cost %v, want %v", cost, want)
	}
	p.Apply(ev("b", time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), 1_000_000, 0), 1)
	_, _, cost, _, _ = p.Totals("acme", "gpt-4o", "day")
	if cost != 5 {
		t.Errorf("after the March price change cost %v, want 5", cost)
	}
	// Budget 10 USD: the first event alone (12 USD) exhausted it.
}

// TestCostChargesEachTokenType: the budget counts an event with every
// token type at each type's own price — cache reads, cache writes and
// reasoning apart from plain input and output — and the minute rollup
// carries each type; a settlement takes its estimate back whole, every
// type included, also after the state went through a snapshot.
func TestCostChargesEachTokenType(t *testing.T) {
	p := partUnder(t, DefaultOptions(), strings.Replace(testPolicy, "cached: 2.5}", "cached: 2.5, cache_write: 6.25, reasoning: 30}", 1))
	at := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	est := ev("a", at, 50_000, 50_000)
	est.Estimated = true
	est.CachedTokens, est.CacheWriteTokens, est.ReasoningTokens = 40_000, 7_000, 20_000
	p.Apply(est, 0)
	p.TakeSignals()
	p.Drain(&Rows{})
	snap, err := p.Snapshot(nil, "fp")
	if err != nil {
		t.Fatal(err)
	}
	l, err := Load(0, DefaultOptions(), p.pol, "fp", snap)
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 plain input, 2,000 cache reads, 3,000 cache writes, 4,000
	// plain output, 5,000 reasoning.
	e := ev("a", at, 6000, 9000)
	e.CachedTokens, e.CacheWriteTokens, e.ReasoningTokens = 2000, 3000, 5000
	want := (1000*5 + 2000*2.5 + 3000*6.25 + 4000*20 + 5000*30) / 1e6
	for name, p := range map[string]*Partition{"state": p, "state loaded from a snapshot": l} {
		p.Apply(e, 1)
		for _, model := range []string{"gpt-4o", "*"} {
			tok, _, cost, _, _ := p.Totals("acme", model, "month")
			if tok != 15000 || math.Abs(cost-want) > 1e-12 {
				t.Errorf("%s, %s month: %d tokens costing %v; want 15000 tokens costing %v", name, model, tok, cost, want)
			}
		}
		var rows Rows
		p.Drain(&rows)
		var m MinuteRow
		for _, r := range rows.Minutes {
			if r.Model == "gpt-4o" {
				m = r
			}
		}
		if m.PromptTokens != 6000 || m.CachedTokens != 2000 || m.CacheWriteTokens != 3000 || m.ReasoningTokens != 5000 ||
			math.Abs(m.Cost-want) > 1e-12 {
			t.Errorf("%s, minute rollup %+v: want 6000 prompt, 2000 cache read, 3000 cache write, 5000 reasoning tokens costing %v", name, m, want)
		}
		for _, q := range rows.Quotas {
			if q.CachedTokens != 2000 || q.CacheWriteTokens != 3000 || q.ReasoningTokens != 5000 {
				t.Errorf("%s, quota_state row %s/%s: cache read %d, cache write %d, reasoning %d; want 2000, 3000, 5000",
					name, q.Model, q.Quota, q.CachedTokens, q.CacheWriteTokens, q.ReasoningTokens)
			}
		}
		if len(rows.Quotas) == 0 {
			t.Errorf("%s: no quota_state rows", name)
		}
	}
}

func TestSlidingRatesAndRateExceeded(t *testing.T) {
	p := newPart(t)
	for m := 0; m < 10; m++ {
		for i := 0; i < 4; i++ {
			p.Apply(ev(fmt.Sprintf("m%d-%d", m, i), t0.Add(time.Duration(m)*time.Minute+time.Duration(i)*time.Second), 100, 50), int64(m*4+i))
		}
	}
	tok, req := p.Rate("acme", "gpt-4o", 5)
	if tok != 600 || req != 4 {
		t.Errorf("5-minute rate %v tok/min %v req/min, want 600 and 4", tok, req)
	}
	tok, _ = p.Rate("acme", "*", 60)
	if tok != 600*10/60.0 {
		t.Errorf("60-minute rate %v, want %v", tok, 6000/60.0)
	}
	p.TakeSignals()
	// TPM 3000 on "*": 20 events of 150 in one minute → over at the 21st.
	for i := 0; i < 25; i++ {
		p.Apply(ev(fmt.Sprintf("burst%d", i), t0.Add(20*time.Minute+time.Duration(i)*time.Second), 100, 50), int64(100+i))
	}
	re := kinds(p.TakeSignals(), schemas.SignalRateExceeded)
	if len(re) != 1 || re[0].Quota != schemas.QuotaTokensPerMinute || re[0].Used != 3150 {
		t.Fatalf("want one rate_exceeded for tokens_per_minute at 3150, got %+v", re)
	}
	if err := re[0].Validate(); err != nil {
		t.Error(err)
	}
}

// trace feeds a steady stream: n minutes of perMin tokens in 10 events each.
func trace(p *Partition, start time.Time, minutes int, perMin int64, off *int64) {
	for m := 0; m < minutes; m++ {
		for i := 0; i < 10; i++ {
			*off++
			p.Apply(ev(fmt.Sprintf("t%d", *off), start.Add(time.Duration(m)*time.Minute+time.Duration(i)*5*time.Second), perMin/10, 0), *off)
		}
	}
}

func TestExhaustionPredictedOnce(t *testing.T) {
	p := partUnder(t, DefaultOptions(), `
tenants:
  acme:
    models:
      "*": {daily_tokens: 100000}
`)
	var off int64
	// 1000 tokens/min: 100 minutes to exhaust, within the 6h horizon from
	// the first seconds of traffic on.
	trace(p, t0, 10, 1000, &off)
	preds := kinds(p.TakeSignals(), schemas.SignalExhaustionPredicted)
	if len(preds) != 1 {
		t.Fatalf("want exactly one exhaustion_predicted, got %d", len(preds))
	}
	s := preds[0]
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	// The first one comes from the rates of the first 15 s; the trace
	// sends its minute's tokens in its first 45 s, so the pace it sees is
	// faster than the minute's: the truth must lie in the range it gives.
	if d := s.Time.Sub(t0); d > 20*time.Second {
		t.Errorf("first prediction %v after the traffic began, want within 20s", d)
	}
	truth := t0.Add(100 * time.Minute)
	lo, hi := attrTime(t, &s, schemas.AttrPredictedEarliest), attrTime(t, &s, schemas.AttrPredictedLatest)
	if truth.Before(lo) || truth.After(hi) || s.Attributes[schemas.AttrPredictionBasis] != BasisRates {
		t.Errorf("predicted %v in [%v, %v] from %q; true exhaustion %v", s.PredictedExhaustion, lo, hi, s.Attributes[schemas.AttrPredictionBasis], truth)
	}
	// quota_state after 10 minutes: the forecast's, within 5 minutes.
	row := quotaRow(t, p, "*", schemas.QuotaDailyTokens)
	if d := row.PredictedExhaustion.Sub(truth); d < -5*time.Minute || d > 5*time.Minute || row.PredictionBasis != BasisForecast {
		t.Errorf("quota_state predicts %v (%s), want about %v from the forecast", row.PredictedExhaustion, row.PredictionBasis, truth)
	}
}

// attrTime parses a signal's time attribute.
func attrTime(t *testing.T, s *schemas.Signal, name string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s.Attributes[name])
	if err != nil {
		t.Fatalf("signal attribute %s=%q: %v", name, s.Attributes[name], err)
	}
	return v
}

// quotaRow drains p and returns acme's current row of quota q for model.
func quotaRow(t *testing.T, p *Partition, model string, q schemas.QuotaKind) QuotaRow {
	t.Helper()
	var rows Rows
	p.Drain(&rows)
	var out QuotaRow
	found := false
	for _, r := range rows.Quotas {
		if r.Tenant == "acme" && r.Model == model && r.Quota == string(q) && (!found || r.PeriodStart.After(out.PeriodStart)) {
			out, found = r, true
		}
	}
	if !found {
		t.Fatalf("no %s row for acme/%s in %+v", q, model, rows.Quotas)
	}
	return out
}

// anomalyPolicy is testPolicy with breakers tight enough for the trace of
// TestRebuildReproducesSignals to open them.
var anomalyPolicy = strings.Replace(testPolicy, "defaults:\n", `defaults:
  breakers:
    error_ratio: {threshold: 0.4, min_requests: 5, window: 1m}
    slow_call:   {threshold: 0.5, slow_call_ms: 3000, min_requests: 5, window: 2m}
`, 1)

// rebuildTrace is a stream with duplicates, estimates settled later, late
// events, error and slow-call phases and token spikes.
func rebuildTrace() []*schemas.UsageEvent {
	var evs, settlements, pending []*schemas.UsageEvent
	for i := 0; i < 3000; i++ {
		at := t0.Add(time.Duration(i) * 7 * time.Second)
		e := ev(fmt.Sprintf("e%d", i%2700), at, int64(i%13), int64(i%7)) // 300 duplicates
		if i%50 == 7 {
			e.Time = at.Add(-3 * time.Hour) // late
		}
		switch {
		case i >= 600 && i < 900 && i%2 == 0, i >= 2300 && i < 2400:
			e.Outcome = schemas.OutcomeError
		case i >= 1800 && i < 2000:
			e.LatencyMS = 5000
		}
		if (i >= 1200 && i < 1210) || (i >= 2600 && i < 2615) {
			e.PromptTokens = 3000 // a spike over a baseline of about 80 tokens/min
		}
		if i%40 == 11 && i < 2600 {
			e.Estimated = true
			e.PromptTokens = 400
			settle := *e
			settle.Estimated, settle.PromptTokens, settle.Outcome = false, 5, schemas.OutcomeError
			if i >= 2000 {
				settlements = append(settlements, &settle) // settled at the end of the stream
			} else {
				pending = append(pending, &settle)
			}
		}
		evs = append(evs, e)
		if len(pending) > 0 && i%40 == 14 { // settled 3 events (21 s) later
			evs = append(evs, pending...)
			pending = pending[:0]
		}
	}
	return append(evs, settlements...)
}

// TestRebuildReproducesSignals: state rebuilt by replaying a prefix (what a
// restarted instance does from ClickHouse) emits exactly the signals of a
// clean run for the rest of the stream, anomalies included.
func TestRebuildReproducesSignals(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	opt := DefaultOptions()
	opt.SpikeMinTokens = 1000
	evs := rebuildTrace()
	run := func(replayUpTo int) []string {
		p := New(0, opt)
		p.SetPolicy(pol)
		p.SetReplay(true)
		for _, i := range stored(pol, opt, evs[:replayUpTo]) {
			p.Apply(evs[i], int64(i))
		}
		p.SetReplay(false)
		var ids []string
		for i := replayUpTo; i < len(evs); i++ {
			p.Apply(evs[i], int64(i))
			for _, s := range p.TakeSignals() {
				ids = append(ids, fingerprint(&s))
			}
		}
		return ids
	}
	clean := run(0)
	if len(clean) < 10 {
		t.Fatalf("trace too tame: %d signals", len(clean))
	}
	// The trace must exercise every detector both ways.
	p := New(0, opt)
	p.SetPolicy(pol)
	seen := map[string]int{}
	for i, e := range evs {
		p.Apply(e, int64(i))
		for _, s := range p.TakeSignals() {
			if s.Kind == schemas.SignalAnomaly {
				seen[s.Attributes["detector"]+":"+s.Attributes["state"]]++
			}
		}
	}
	for _, d := range []string{DetectorErrorRatio, DetectorSlowCall, DetectorRateSpike} {
		if seen[d+":firing"] == 0 || seen[d+":resolved"] == 0 {
			t.Errorf("trace does not fire and resolve %s: %v", d, seen)
		}
	}
	for _, cut := range []int{1, 500, 700, 1205, 1234, 1900, 2350, 2999, 3030} {
		got := run(cut)
		// the clean run's signals emitted at offsets >= cut
		var want []string
		p := New(0, opt)
		p.SetPolicy(pol)
		for i, e := range evs {
			p.Apply(e, int64(i))
			for _, s := range p.TakeSignals() {
				if i >= cut {
					want = append(want, fingerprint(&s))
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("cut %d: rebuilt run emitted %d signals, clean run %d; they differ", cut, len(got), len(want))
		}
	}
}

// fingerprint is what a replay must reproduce of a signal: its id, where
// and when it was computed and its figures.
func fingerprint(s *schemas.Signal) string {
	return fmt.Sprintf("%s@%d %v %g/%g %g %v", s.ID, s.Source.FromOffset, s.Time.Unix(), s.Used, s.Limit, s.Rate, s.Attributes)
}

// stored returns what ClickHouse holds after a clean run over evs, as a
// rebuild replays it: the indexes of each id's latest counted version, in
// index (offset) order.
func stored(pol *policy.Policy, opt Options, evs []*schemas.UsageEvent) []int {
	p := New(0, opt)
	p.SetPolicy(pol)
	latest := map[string]int{}
	for i, e := range evs {
		if p.Apply(e, int64(i)) == Accepted {
			latest[e.Tenant+"/"+e.ID] = i
		}
	}
	out := make([]int, 0, len(latest))
	for _, i := range latest {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

// TestRejectedEventsDoNotBlockFurther: events for requests the gateway
// refused (outcome rejected, zero tokens) are counted as events but add
// nothing to token quotas, requests_per_minute or the error ratio, so a
// refused client retrying cannot keep its own limit shut.
func TestRejectedEventsDoNotBlockFurther(t *testing.T) {
	p := newPart(t)
	for i := 0; i < 300; i++ {
		e := ev(fmt.Sprintf("rej%d", i), t0.Add(time.Duration(i)*100*time.Millisecond), 0, 0)
		e.Outcome, e.Status = schemas.OutcomeRejected, 429
		if r := p.Apply(e, int64(i)); r != Accepted {
			t.Fatalf("rejected event %d: %v, want Accepted (counted as an event)", i, r)
		}
	}
	if sigs := p.TakeSignals(); len(sigs) != 0 {
		t.Fatalf("300 refused requests in a minute (requests_per_minute 100) emitted %+v, want nothing", sigs)
	}
	if _, req := p.Rate("acme", "*", 5); req != 0 {
		t.Fatalf("request rate %v, want 0: refused requests are not served requests", req)
	}
	if tok := totals(t, p, "*", "day"); tok != 0 {
		t.Fatalf("daily tokens %d, want 0", tok)
	}
}

// Once a quota is used up, quota_state's predicted_exhaustion is the time
// it ran out, never a time ahead (a tenant at 123% was shown a future
// exhaustion time).
func TestPredictionOfAnExhaustedQuotaIsWhenItRanOut(t *testing.T) {
	p := partUnder(t, DefaultOptions(), `
tenants:
  acme:
    models:
      "*": {daily_tokens: 100000}
`)
	var off int64
	trace(p, t0, 10, 1000, &off) // a prediction about 90 minutes ahead
	var rows Rows
	p.Drain(&rows)
	pred := func() time.Time {
		t.Helper()
		rows.Reset()
		p.Drain(&rows)
		for _, r := range rows.Quotas {
			if r.Tenant == "acme" && r.Model == "*" && r.Quota == string(schemas.QuotaDailyTokens) && r.PeriodStart.Equal(t0.Truncate(24*time.Hour)) {
				return r.PredictedExhaustion
			}
		}
		t.Fatalf("no daily quota row for acme/*: %+v", rows.Quotas)
		return time.Time{}
	}
	at := t0.Add(9*time.Minute + 50*time.Second) // in the last minute traced: no minute completes
	off++
	p.Apply(ev("big", at, 113000, 0), off) // 123% of the daily quota
	if got := pred(); got.IsZero() || got.After(at) {
		t.Fatalf("at 123%% predicted_exhaustion = %v, want the time it ran out (%v)", got, at)
	}
	// Later minutes complete and the predictor runs again: still no future time.
	trace(p, t0.Add(11*time.Minute), 3, 1000, &off)
	if got := pred(); !got.Equal(at) {
		t.Fatalf("after more minutes predicted_exhaustion = %v, want %v", got, at)
	}
}

// A flush that spans more than one period boundary of a tenant (an
// aggregator catching up after downtime reads hours of events between two
// flushes) still writes the final row of every period that closed: the
// first hour's total must not be lost when the second hour closes too.
func TestDrainKeepsEveryPeriodClosedSinceTheLastDrain(t *testing.T) {
	p := newPart(t)
	var rows Rows
	start := t0.Add(30 * time.Minute) // 11:30 in Shanghai
	p.Apply(ev("a", start, 100, 0), 1)
	p.Drain(&rows)
	rows.Reset()
	// Without a drain: more of the first hour, then all of the next, then
	// the one after. Both earlier hours close before the next Drain.
	p.Apply(ev("b", start.Add(20*time.Minute), 200, 0), 2)
	p.Apply(ev("c", start.Add(50*time.Minute), 400, 0), 3)
	p.Apply(ev("d", start.Add(110*time.Minute), 800, 0), 4)
	p.Drain(&rows)
	got := map[string]float64{}
	for _, r := range rows.Quotas {
		if r.Model == "*" && r.Quota == "hourly_tokens" {
			got[r.PeriodStart.Format("15:04")] = r.Used
		}
	}
	want := map[string]float64{"03:00": 300, "04:00": 400, "05:00": 800}
	for h, w := range want {
		if got[h] != w {
			t.Errorf("hour %s UTC: row says %v tokens, want %v (rows %v)", h, got[h], w, got)
		}
	}
}

// The one-minute quotas are sliding 60-second windows, as the request
// path's admission rules are: a burst split across a calendar minute's
// boundary (under the limit in each calendar minute, nearly twice it
// within 60 s) is over its limit, and the throttle the signal asks for
// lasts until the window is back under with nothing more counted.
func TestMinuteQuotasAreSlidingWindows(t *testing.T) {
	p := newPart(t)
	start := t0.Add(40 * time.Second) // second 40 of a minute
	off := int64(0)
	for i := 0; i < 30; i++ { // 30 × 150 = 4500 tokens in 30 s; 2250 in each calendar minute
		off++
		p.Apply(ev(fmt.Sprintf("b%d", i), start.Add(time.Duration(i)*time.Second), 100, 50), off)
	}
	re := kinds(p.TakeSignals(), schemas.SignalRateExceeded)
	if len(re) != 1 || re[0].Quota != schemas.QuotaTokensPerMinute || re[0].Used != 3150 {
		t.Fatalf("want one rate_exceeded for tokens_per_minute at 3150 (the 21st event, across the minute boundary), got %+v", re)
	}
	// Over at second 60 (the 21st event, 3150 tokens from second 40 on);
	// with nothing more counted it is back at 3000 once second 40 leaves
	// the window: at second 100.
	if got, want := re[0].PeriodEnd, start.Add(60*time.Second); !got.Equal(want) {
		t.Errorf("throttle until %v, want %v", got, want)
	}
	if err := re[0].Validate(); err != nil {
		t.Error(err)
	}
	for i := 0; i < 25; i++ {
		off++
		p.Apply(ev(fmt.Sprintf("c%d", i), start.Add(time.Duration(61+i)*time.Second), 100, 50), off)
	}
	// Still over once that throttle has run out: signalled again, never
	// while a throttle asked for runs.
	again := kinds(p.TakeSignals(), schemas.SignalRateExceeded)
	if len(again) == 0 {
		t.Fatal("no new rate_exceeded once the first throttle ended while the tenant stayed over")
	}
	until := re[0].PeriodEnd
	for _, sg := range again {
		if sg.Time.Before(until) || sg.ID == re[0].ID {
			t.Fatalf("rate_exceeded at %v while the throttle until %v still ran: %+v", sg.Time, until, sg)
		}
		until = sg.PeriodEnd
	}
}

// TestBilledQuotaCountsBilledEquivalentTokens: a quota with count: billed
// counts each token type at its price over the input price, so cheap
// cache reads leave it room that total tokens would have used up; a
// total quota beside it counts every token.
func TestBilledQuotaCountsBilledEquivalentTokens(t *testing.T) {
	p := partUnder(t, DefaultOptions(), `
tenants:
  acme:
    models:
      "*": {monthly_tokens: 10000, count: billed}
      gpt-x: {monthly_tokens: 10000}
prices:
  - {model: gpt-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2, completion: 8, cached: 0.5}
`)
	// 1,000 plain input, 9,000 cache reads at a quarter, 1,000 output at
	// four times the input price: 7,250 billed-equivalent, 11,000 total.
	e := &schemas.UsageEvent{ID: "a", Time: t0, Tenant: "acme", Model: "gpt-x", PromptTokens: 10000, CachedTokens: 9000, CompletionTokens: 1000}
	p.Apply(e, 0)
	var exhausted []string
	for _, s := range kinds(p.TakeSignals(), schemas.SignalQuotaExhausted) {
		exhausted = append(exhausted, s.Model+"/"+string(s.Quota))
	}
	if strings.Join(exhausted, ",") != "gpt-x/monthly_tokens" {
		t.Errorf("exhausted %v, want gpt-x/monthly_tokens only (11,000 total tokens; * counts 7,250 billed)", exhausted)
	}
	var rows Rows
	p.Drain(&rows)
	used := map[string]float64{}
	for _, r := range rows.Quotas {
		used[r.Model] = r.Used
	}
	if used["*"] != 7250 || used["gpt-x"] != 11000 {
		t.Errorf("quota_state used %v, want * 7250 (billed) and gpt-x 11000 (total)", used)
	}
}

// TestMonthsBeginOnTheTenantsBillingDay: a tenant billed from the 15th in
// New York counts its monthly quota and budget from the 15th's local
// midnight — across the start of daylight saving time (March 8th, 2026)
// — resets both there and not on the 1st, and signals carry those bounds.
func TestMonthsBeginOnTheTenantsBillingDay(t *testing.T) {
	p := partUnder(t, DefaultOptions(), `
tenants:
  acme:
    timezone: America/New_York
    billing_day: 15
    budget: {amount: 10, currency: USD}
    models:
      "*": {monthly_tokens: 1000}
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10}
`)
	ny, _ := time.LoadLocation("America/New_York")
	p.Apply(ev("a", time.Date(2026, 2, 20, 12, 0, 0, 0, ny), 100, 0), 0)
	p.Apply(ev("b", time.Date(2026, 3, 1, 12, 0, 0, 0, ny), 200, 0), 1) // the calendar month changes: the billing month does not
	_, _, _, start, _ := p.Totals("acme", "*", "month")
	if want := time.Date(2026, 2, 15, 0, 0, 0, 0, ny); !start.Equal(want) || totals(t, p, "*", "month") != 300 {
		t.Fatalf("on March 1st the month began %v with %d tokens; want %v (the billing day, EST) with 300", start, totals(t, p, "*", "month"), want)
	}
	for _, s := range kinds(p.TakeSignals(), schemas.SignalPeriodReset) {
		if s.Quota == schemas.QuotaMonthlyTokens || s.Quota == schemas.QuotaBudget {
			t.Errorf("the 1st reset %s", s.Quota)
		}
	}
	p.Apply(ev("c", time.Date(2026, 3, 14, 23, 59, 0, 0, ny), 1, 0), 2)
	p.Apply(ev("d", time.Date(2026, 3, 15, 0, 0, 0, 0, ny), 7, 0), 3)
	_, _, _, start, _ = p.Totals("acme", "*", "month")
	if want := time.Date(2026, 3, 15, 0, 0, 0, 0, ny); !start.Equal(want) || start.UTC().Hour() != 4 || totals(t, p, "*", "month") != 7 {
		t.Fatalf("on March 15th the month began %v (%v UTC) with %d tokens; want local midnight, EDT (04:00 UTC), with 7", start, start.UTC(), totals(t, p, "*", "month"))
	}
	var reset []string
	for _, s := range kinds(p.TakeSignals(), schemas.SignalPeriodReset) {
		reset = append(reset, string(s.Quota))
		if !s.PeriodStart.Equal(start) || !s.PeriodEnd.Equal(time.Date(2026, 4, 15, 0, 0, 0, 0, ny)) {
			t.Errorf("%s reset for %v..%v; want the billing month %v..April 15th", s.Quota, s.PeriodStart, s.PeriodEnd, start)
		}
	}
	if fmt.Sprint(reset) != "[monthly_tokens budget]" {
		t.Errorf("the billing day reset %v; want the monthly quota and the budget", reset)
	}
}

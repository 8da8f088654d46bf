package breaker

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

const policyYAML = `
defaults:
  mode: hard
  breakers:
    error_ratio: {threshold: 0.5, min_requests: 20, window: 1m, open_for: 30s, max_open_for: 2m, half_open_probes: 5}
    slow_call: {threshold: 0.5, slow_call_ms: 10000, min_requests: 20, window: 1m, open_for: 30s, max_open_for: 10m, half_open_probes: 5}
tenants:
  acme:
    models:
      "*": {monthly_tokens: 1000, tokens_per_minute: 100}
      gpt-4o: {monthly_tokens: 500, mode: soft}
`

func testPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(policyYAML), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var t0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

func exhausted(model string, quota schemas.QuotaKind, end time.Time) *schemas.Signal {
	return &schemas.Signal{ID: "x", Kind: schemas.SignalQuotaExhausted, Time: t0, Tenant: "acme", Model: model, Quota: quota,
		Period: schemas.PeriodMonth, PeriodEnd: end, Used: 1000, Limit: 1000, Unit: schemas.UnitTokens}
}

func TestHardQuotaOpensUntilPeriodEndWithoutHalfOpen(t *testing.T) {
	p := testPolicy(t)
	tb := NewTable()
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	res := tb.Apply(exhausted("*", schemas.QuotaMonthlyTokens, end), p.Tenant("acme"), t0)
	if len(res.Changed) != 1 {
		t.Fatalf("result %+v", res)
	}
	f := tb.Flags("acme")["*"]
	if f == nil || f.State != flags.StateOpen || f.Kind != flags.KindQuota || f.Quota != "monthly_tokens" || !f.ResetsAt.Equal(end) || f.Limit != 1000 {
		t.Fatalf("flag %+v", f)
	}
	// The breaker's own end, not capped: an unchanged flag reads the same
	// at every refresh, which then rewrites and announces nothing.
	if !f.Until.Equal(end) || f.RetryAfter != 0 {
		t.Fatalf("flag until %v, retry after %v; want the period end %v and no hint", f.Until, f.RetryAfter, end)
	}
	// Still open just before the boundary, closed (not half-open) after.
	tb.Tick(end.Add(-time.Second), p.Tenant)
	if len(tb.Breakers("acme")) != 1 {
		t.Fatal("closed before the period end")
	}
	if ch := tb.Tick(end, p.Tenant); len(ch) != 1 || len(tb.Breakers("acme")) != 0 {
		t.Fatalf("not closed at the period end: %v %+v", ch, tb.Breakers("acme"))
	}
}

func TestPeriodResetAndTierDownClose(t *testing.T) {
	p := testPolicy(t)
	tb := NewTable()
	end := t0.Add(24 * time.Hour)
	tb.Apply(exhausted("*", schemas.QuotaMonthlyTokens, end), p.Tenant("acme"), t0)
	tb.Apply(&schemas.Signal{Kind: schemas.SignalPeriodReset, Tenant: "acme", Model: "*", Quota: schemas.QuotaMonthlyTokens}, p.Tenant("acme"), t0)
	if len(tb.Breakers("")) != 0 {
		t.Fatal("period_reset did not close the quota breaker")
	}
	tb.Apply(exhausted("*", schemas.QuotaMonthlyTokens, end), p.Tenant("acme"), t0)
	tb.Apply(&schemas.Signal{Kind: schemas.SignalTierCrossed, Direction: schemas.DirectionDown, Tier: 90, Tenant: "acme", Model: "*", Quota: schemas.QuotaMonthlyTokens}, p.Tenant("acme"), t0)
	if len(tb.Breakers("")) != 0 {
		t.Fatal("tier down (limit raised) did not close the quota breaker")
	}
}

// TestSoftQuotaRecordsOverageAndNeverBlocks: a soft quota past its limit
// is recorded as overage and flagged soft — a state that refuses nothing
// and tells gateways to serve a fallback model — until its period ends
// (or resets); a refusing flag on the same scope wins over it.
func TestSoftQuotaRecordsOverageAndNeverBlocks(t *testing.T) {
	p := testPolicy(t)
	tb := NewTable()
	end := t0.Add(time.Hour)
	res := tb.Apply(exhausted("gpt-4o", schemas.QuotaMonthlyTokens, end), p.Tenant("acme"), t0)
	if !res.SoftOverage || len(res.Changed) != 1 || tb.Overage() != 1 {
		t.Fatalf("soft quota: %+v breakers=%v", res, tb.Breakers(""))
	}
	f := tb.Flags("acme")["gpt-4o"]
	if f == nil || f.State != flags.StateSoft || f.Kind != flags.KindQuota || !f.ResetsAt.Equal(end) || f.Quota != string(schemas.QuotaMonthlyTokens) {
		t.Fatalf("soft quota's flag: %+v, want state soft until the period ends", f)
	}
	tb.Apply(&schemas.Signal{Kind: schemas.SignalRateExceeded, Time: t0, Tenant: "acme", Model: "gpt-4o", Quota: schemas.QuotaTokensPerMinute,
		Period: schemas.PeriodMinute, PeriodEnd: t0.Add(40 * time.Second), Used: 150, Limit: 100, Mode: schemas.ModeHard}, p.Tenant("acme"), t0)
	if f := tb.Flags("acme")["gpt-4o"]; f == nil || f.State != flags.StateThrottle {
		t.Fatalf("a hard rate refusal on the soft flag's scope: %+v, want the throttle written", f)
	}
	tb.Apply(&schemas.Signal{Kind: schemas.SignalPeriodReset, Tenant: "acme", Model: "gpt-4o", Quota: schemas.QuotaMonthlyTokens}, p.Tenant("acme"), t0)
	for _, b := range tb.Breakers("acme") {
		if b.State == flags.StateSoft {
			t.Fatalf("period_reset left the soft flag: %+v", b)
		}
	}
}

func TestRateWindowThrottlesUntilWindowEnd(t *testing.T) {
	p := testPolicy(t)
	tb := NewTable()
	s := &schemas.Signal{Kind: schemas.SignalRateExceeded, Time: t0, Tenant: "acme", Model: "*", Quota: schemas.QuotaTokensPerMinute,
		Period: schemas.PeriodMinute, PeriodEnd: t0.Add(40 * time.Second), Used: 150, Limit: 100}
	tb.Apply(s, p.Tenant("acme"), t0)
	f := tb.Flags("acme")["*"]
	if f == nil || f.State != flags.StateThrottle || !f.ResetsAt.Equal(t0.Add(40*time.Second)) {
		t.Fatalf("flag %+v", f)
	}
	tb.Tick(t0.Add(40*time.Second), p.Tenant)
	if len(tb.Breakers("")) != 0 {
		t.Fatal("rate breaker outlived its window")
	}
	// A rate signal whose window is already over is ignored.
	if res := tb.Apply(s, p.Tenant("acme"), t0.Add(time.Minute)); len(res.Changed) != 0 {
		t.Fatal("stale rate signal opened a breaker")
	}
}

// anomaly is a signal of the detector computed at at (its window ends then).
func anomaly(detector, ratio, requests string, at time.Time) *schemas.Signal {
	return &schemas.Signal{Kind: schemas.SignalAnomaly, Time: at, Tenant: "acme", Model: "gpt-4o",
		Attributes: map[string]string{"detector": detector, "ratio": ratio, "requests": requests}}
}

func TestErrorRatioBreakerHalfOpensAndBacksOff(t *testing.T) {
	p := testPolicy(t)
	tp := p.Tenant("acme")
	tb := NewTable()
	key := Key{Tenant: "acme", Scope: "gpt-4o", Kind: flags.KindErrorRatio}
	state := func() *Breaker {
		for _, b := range tb.Breakers("acme") {
			if b.Key == key {
				return &b
			}
		}
		return nil
	}
	if tb.Apply(anomaly("error_ratio", "0.9", "5", t0), tp, t0); state() != nil {
		t.Fatal("opened below min_requests")
	}
	if tb.Apply(anomaly("error_ratio", "0.4", "100", t0), tp, t0); state() != nil {
		t.Fatal("opened below the threshold")
	}
	now := t0
	tb.Apply(anomaly("error_ratio", "0.6", "100", now), tp, now)
	wantOpen := []time.Duration{30 * time.Second, 60 * time.Second, 120 * time.Second, 120 * time.Second} // capped at max_open_for
	for i, d := range wantOpen {
		b := state()
		if b == nil || b.State != flags.StateOpen || b.Until.Sub(now) != d {
			t.Fatalf("round %d: want open for %v, got %+v", i, d, b)
		}
		now = b.Until
		tb.Tick(now, p.Tenant)
		if b := state(); b == nil || b.State != flags.StateHalfOpen || b.Probes != 5 {
			t.Fatalf("round %d: want half-open with 5 probes, got %+v", i, b)
		}
		// The probes fail: open again, longer.
		tb.Apply(anomaly("error_ratio", "0.7", "25", now), tp, now)
	}
	// Now the probes succeed: closed.
	now = state().Until
	tb.Tick(now, p.Tenant)
	tb.Apply(anomaly("error_ratio", "0.1", "25", now), tp, now)
	if state() != nil {
		t.Fatal("half-open breaker did not close on good probes")
	}
	// A half-open breaker with no verdict for a window closes too.
	tb.Apply(anomaly("slow_call", "0.8", "100", now), tp, now)
	tb.Tick(now.Add(30*time.Second), p.Tenant)
	tb.Tick(now.Add(30*time.Second+time.Minute), p.Tenant)
	if len(tb.Breakers("acme")) != 0 {
		t.Fatalf("slow-call breaker left: %+v", tb.Breakers("acme"))
	}
}

func TestManualBlacklistAndOverrides(t *testing.T) {
	p := testPolicy(t)
	tb := NewTable()
	tb.Trip("acme", "*", "incident 42", "alice", t0.Add(time.Hour), t0)
	tb.Blacklist("acme", "", "fraud", "bob", t0.Add(2*time.Hour), t0)
	tb.Blacklist("acme", "k1", "leaked", "bob", t0.Add(2*time.Hour), t0)
	fl := tb.Flags("acme")
	if fl["*"].Kind != flags.KindBlacklist {
		t.Fatalf("blacklist must win over manual on one scope: %+v", fl["*"])
	}
	if fl[flags.KeyField("k1")] == nil || fl[flags.KeyField("k1")].State != flags.StateBlacklist {
		t.Fatalf("key blacklist missing: %+v", fl)
	}
	if !tb.Unblacklist("acme", "") || tb.Flags("acme")["*"].Kind != flags.KindManual {
		t.Fatal("unblacklist did not uncover the manual breaker")
	}
	if !tb.Reset("acme", "*", "") || tb.Flags("acme")["*"] != nil {
		t.Fatal("reset did not close the manual breaker")
	}

	// A leaked key: the model's quota goes to zero now, until the override ends.
	tb.SetOverride(Override{Tenant: "acme", Model: "gpt-4o", Quota: "daily_tokens", Limit: 0, Until: t0.Add(time.Hour), Reason: "leak"}, t0)
	if f := tb.Flags("acme")["gpt-4o"]; f == nil || f.Kind != flags.KindQuota || f.Limit != 0 {
		t.Fatalf("zero override: %+v", f)
	}
	tb.Tick(t0.Add(time.Hour), p.Tenant)
	if tb.Flags("acme")["gpt-4o"] != nil || len(tb.Overrides("")) != 0 {
		t.Fatal("zero override outlived its expiry")
	}
	// A promotion: a raised limit keeps the quota breaker shut below it.
	tb.SetOverride(Override{Tenant: "acme", Model: "*", Quota: "monthly_tokens", Limit: 5000, Until: t0.Add(time.Hour)}, t0)
	if res := tb.Apply(exhausted("*", schemas.QuotaMonthlyTokens, t0.Add(24*time.Hour)), p.Tenant("acme"), t0); len(res.Changed) != 0 {
		t.Fatal("raised override did not hold the breaker shut")
	}
	s := exhausted("*", schemas.QuotaMonthlyTokens, t0.Add(24*time.Hour))
	s.Kind, s.Direction, s.Tier, s.Used = schemas.SignalTierCrossed, schemas.DirectionUp, 90, 5000
	if res := tb.Apply(s, p.Tenant("acme"), t0); len(res.Changed) != 1 {
		t.Fatal("usage past the override's limit did not open the breaker")
	}
}

// A flag read back from Redis becomes a breaker that lasts as long as the
// one that wrote it, not only as long as the flag's TTL-capped Until.
func TestRestoreRebuildsTheBreakersOwnEnd(t *testing.T) {
	tb := NewTable()
	written := t0.Add(-10 * time.Second)
	bl := &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: written.Add(time.Minute), RetryAfter: 2 * time.Hour, Reason: "leak"}
	q := &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "daily_tokens", Until: written.Add(time.Minute), ResetsAt: t0.Add(5 * time.Hour)}
	old := &flags.Flag{State: flags.StateOpen, Kind: flags.KindErrorRatio, Until: written.Add(time.Minute), RetryAfter: 5 * time.Second}
	if !tb.Restore("acme", "*", bl, written, t0) || !tb.Restore("acme", "gpt-4o", q, written, t0) {
		t.Fatal("not restored")
	}
	if tb.Restore("acme", "claude", old, written, t0) {
		t.Fatal("a breaker already over was restored")
	}
	if tb.Restore("acme", "*", bl, written, t0) {
		t.Fatal("a breaker already in the table was replaced")
	}
	bs := tb.Breakers("acme")
	if len(bs) != 2 || !bs[0].Until.Equal(written.Add(2*time.Hour)) || !bs[1].Until.Equal(t0.Add(5*time.Hour)) {
		t.Fatalf("breakers %+v", bs)
	}
}

// An override set below the tenant's current use blocks at once, not at the
// tenant's next upward tier crossing; clearing it lifts the block.
func TestOverrideBelowCurrentUseBlocksAtOnce(t *testing.T) {
	p := testPolicy(t)
	tb := NewTable()
	end := t0.Add(5 * time.Hour)
	// The tenant crossed 70% and is now at 75% of 1000.
	tb.Apply(&schemas.Signal{Kind: schemas.SignalTierCrossed, Direction: schemas.DirectionUp, Tier: 70, Tenant: "acme", Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth, PeriodEnd: end, Used: 750, Limit: 1000}, p.Tenant("acme"), t0)
	tb.SetOverride(Override{Tenant: "acme", Model: "*", Quota: "monthly_tokens", Limit: 500, Until: t0.Add(time.Hour), Reason: "promo over"}, t0)
	f := tb.Flags("acme")["*"]
	if f == nil || f.Kind != flags.KindQuota || f.Limit != 500 || f.Used != 750 {
		t.Fatalf("override at 50%% for a tenant at 75%%: flag %+v, want a quota breaker now", f)
	}
	// Set above the use, an override does not block.
	tb.SetOverride(Override{Tenant: "acme", Model: "gpt-4o", Quota: "monthly_tokens", Limit: 900, Until: t0.Add(time.Hour)}, t0)
	if tb.Flags("acme")["gpt-4o"] != nil {
		t.Fatal("override above unknown use blocked")
	}
	if !tb.ClearOverride("acme", "*", "monthly_tokens") || tb.Flags("acme")["*"] != nil {
		t.Fatal("clearing the override left its breaker")
	}
}

// An anomaly whose window is long over (a new consumer group reading the
// signals topic from the earliest offset) opens no breaker and closes no
// half-open one; a fresh one still does.
func TestStaleAnomalyIsIgnored(t *testing.T) {
	p := testPolicy(t)
	tp := p.Tenant("acme")
	tb := NewTable()
	now := t0.Add(72 * time.Hour)
	res := tb.Apply(anomaly("error_ratio", "0.9", "100", t0), tp, now)
	if len(tb.Breakers("acme")) != 0 || !res.Stale {
		t.Fatalf("an anomaly three days old opened %+v (result %+v)", tb.Breakers("acme"), res)
	}
	// With its window: [start, end) an hour ago is stale too.
	w := anomaly("slow_call", "0.9", "100", now.Add(-time.Hour))
	w.PeriodStart, w.PeriodEnd = now.Add(-time.Hour-time.Minute), now.Add(-time.Hour)
	if tb.Apply(w, tp, now); len(tb.Breakers("acme")) != 0 {
		t.Fatal("an anomaly of a window an hour ago opened a breaker")
	}
	// Read a few seconds late, a current anomaly still opens.
	w.PeriodStart, w.PeriodEnd, w.Time = now.Add(-time.Minute), now.Add(-5*time.Second), now.Add(-5*time.Second)
	if tb.Apply(w, tp, now); len(tb.Breakers("acme")) != 1 {
		t.Fatal("a current anomaly read 5s late did not open the breaker")
	}
	// A stale good verdict does not close a half-open breaker.
	half := now.Add(30 * time.Second)
	tb.Tick(half, p.Tenant)
	if bs := tb.Breakers("acme"); len(bs) != 1 || bs[0].State != flags.StateHalfOpen {
		t.Fatalf("want half-open, got %+v", bs)
	}
	if tb.Apply(anomaly("slow_call", "0.1", "100", t0), tp, half); len(tb.Breakers("acme")) != 1 {
		t.Fatal("a days-old good verdict closed a half-open breaker")
	}
}

// probe is the aggregator's verdict on a half-open breaker's probes.
func probe(detector, verdict string, at time.Time) *schemas.Signal {
	s := anomaly(detector, "1", "1", at)
	s.Attributes["probe"] = verdict
	return s
}

// TestHalfOpenIsJudgedByItsProbes: two gateways send 5 probes each, 10
// calls where min_requests is 20. The window's "resolved" over those 10
// calls does not close the half-open breaker (it judged too few calls);
// a failed probe reopens it with a doubled open time, round after round;
// passed probes close it. Verdicts for a breaker that is not half-open
// change nothing.
func TestHalfOpenIsJudgedByItsProbes(t *testing.T) {
	p := testPolicy(t)
	tp := p.Tenant("acme")
	tb := NewTable()
	state := func() *Breaker {
		bs := tb.Breakers("acme")
		if len(bs) == 0 {
			return nil
		}
		return &bs[0]
	}
	now := t0
	if res := tb.Apply(probe("error_ratio", "failed", now), tp, now); len(res.Changed) != 0 || state() != nil {
		t.Fatal("a probe verdict opened a closed breaker")
	}
	tb.Apply(anomaly("error_ratio", "0.8", "40", now), tp, now)
	if res := tb.Apply(probe("error_ratio", "passed", now), tp, now); len(res.Changed) != 0 || state().State != flags.StateOpen {
		t.Fatal("a probe verdict closed an open breaker")
	}
	for i, want := range []time.Duration{60 * time.Second, 120 * time.Second} {
		now = state().Until
		tb.Tick(now, p.Tenant)
		resolved := anomaly("error_ratio", "0.3", "10", now.Add(time.Second))
		resolved.Attributes["state"] = "resolved"
		if tb.Apply(resolved, tp, now.Add(time.Second)); state() == nil || state().State != flags.StateHalfOpen {
			t.Fatalf("round %d: a window of 10 calls (min_requests 20) closed the half-open breaker: %+v", i, state())
		}
		now = now.Add(2 * time.Second)
		tb.Apply(probe("error_ratio", "failed", now), tp, now)
		if b := state(); b == nil || b.State != flags.StateOpen || b.Until.Sub(now) != want || b.Failures != i+1 {
			t.Fatalf("round %d: after a failed probe %+v, want open for %v", i, b, want)
		}
	}
	now = state().Until
	tb.Tick(now, p.Tenant)
	tb.Apply(probe("slow_call", "passed", now), tp, now)
	if state() == nil {
		t.Fatal("a slow-call verdict closed the error-ratio breaker")
	}
	tb.Apply(probe("error_ratio", "passed", now), tp, now)
	if state() != nil {
		t.Fatalf("passed probes left %+v", state())
	}
}

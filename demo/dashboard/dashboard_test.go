package dashboard

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

type rows []Row

func (r rows) Rows(context.Context) ([]Row, error) { return r, nil }

func TestRenderShowsWhatTheDemoPromises(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	Render(&b, []Row{{Tenant: "runaway", Model: "*", Quota: "hourly_tokens", Period: "hour", Used: 950, Limit: 1000,
		RatePerMinute: 480000, Exhaustion: now.Add(7 * time.Second), Breaker: "closed", Served: 120, Refused: 3,
		Admitted: 118, AdmissionRefused: 2, RefusedBy: "runaway-tpm", Alerts: []string{"tier90"}}}, now)
	out := b.String()
	for _, want := range []string{"runaway", "hourly_tokens/hour", "95.0%", "[###################.]", "480000", "in 7s", "closed", "120", "118/2 runaway-tpm", "tier90"} {
		if !strings.Contains(out, want) {
			t.Errorf("view lacks %q:\n%s", want, out)
		}
	}
}

// TestExhaustsShowsThePredictionWithItsRange: what the EXHAUSTS column
// says for each state of a prediction.
func TestExhaustsShowsThePredictionWithItsRange(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		r    Row
		want string
	}{
		{Row{}, "-"},
		{Row{Exhaustion: now.Add(65 * time.Second), ExhaustionEarliest: now.Add(50 * time.Second), ExhaustionLatest: now.Add(100 * time.Second)}, "in 1m5s (50s-1m40s)"},
		{Row{Exhaustion: now.Add(time.Hour), ExhaustionEarliest: now.Add(40 * time.Minute)}, "in 1h0m (40m0s-)"},
		{Row{Exhaustion: now.Add(3*time.Hour + 54*time.Minute + 32*time.Second), ExhaustionEarliest: now.Add(3*time.Hour + 39*time.Minute),
			ExhaustionLatest: now.Add(4*time.Hour + 11*time.Minute + 43*time.Second)}, "in 3h55m (3h39m-4h12m)"},
		{Row{Exhaustion: now.Add(time.Minute)}, "in 1m0s"},
		{Row{Exhaustion: now.Add(-time.Second), ExhaustionEarliest: now.Add(-time.Minute)}, "now"},
	} {
		if got := exhausts(c.r, now); got != c.want {
			t.Errorf("%+v: %q, want %q", c.r, got, c.want)
		}
		var b bytes.Buffer
		c.r.Tenant = "runaway"
		Render(&b, []Row{c.r}, now)
		if !strings.Contains(b.String(), " "+c.want+" ") {
			t.Errorf("the view lacks %q:\n%s", c.want, b.String())
		}
	}
}

func TestPlainModeWritesNoTerminalCodes(t *testing.T) {
	var b bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = Run(ctx, &b, rows{{Tenant: "a", Limit: 1}}, false, time.Hour, 0, time.Now)
	if strings.Contains(b.String(), "\033[") || !strings.Contains(b.String(), "TENANT") {
		t.Fatalf("plain output:\n%q", b.String())
	}
}

// noted is a source that shows one view per call, noting the runaway's
// milestones as the demo's does, and ends the run after the last.
type noted struct {
	views []view
	i     int
	m     *Milestones
	clock *time.Time
	done  func()
}

type view struct {
	at   time.Time
	rows []Row
}

func (n *noted) Rows(context.Context) ([]Row, error) {
	v := n.views[n.i]
	*n.clock = v.at
	if n.i++; n.i == len(n.views) {
		n.done()
	}
	n.m.Observe(v.rows, v.at)
	return v.rows, nil
}

func (n *noted) Notes() []string { return n.m.Notes() }

// TestMilestonesSayHowEarlyThePredictionCame: the first view with a
// predicted exhaustion for the runaway is reported with the seconds since
// its first call and the share of the quota used then; the first view
// with the predictive alert with its share; later views change neither,
// and in plain mode each line is written once, prediction first.
func TestMilestonesSayHowEarlyThePredictionCame(t *testing.T) {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := &Milestones{Tenant: "runaway", Alert: "SluiceQuotaExhaustionPredicted", Started: func() time.Time { return start }}
	at := func(after time.Duration, used float64, exh time.Duration, alerts ...string) view {
		now := start.Add(after)
		r := Row{Tenant: "runaway", Quota: "hourly_tokens", Period: "hour", Used: used, Limit: 1000, Alerts: alerts,
			Served: int64(after/time.Second) * 12, Refused: 1}
		if exh > 0 {
			r.Exhaustion, r.ExhaustionEarliest, r.ExhaustionLatest, r.ExhaustionBasis = now.Add(exh), now.Add(exh-5*time.Second), now.Add(exh+9*time.Second), "rates"
		}
		// Another tenant's prediction and alert are not the runaway's.
		other := Row{Tenant: "acme", Used: 1, Limit: 10, Exhaustion: now.Add(time.Hour), Alerts: []string{"SluiceQuotaExhaustionPredicted/warning"}}
		return view{at: now, rows: []Row{other, r}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var clock time.Time
	src := &noted{m: m, clock: &clock, done: cancel, views: []view{
		at(5*time.Second, 60, 0),
		at(12*time.Second, 150, 68*time.Second),
		at(13*time.Second, 162, 66*time.Second, "SluiceQuotaTier/info"),
		at(22*time.Second, 275, 58*time.Second, "SluiceQuotaExhaustionPredicted/warning"),
		at(30*time.Second, 375, 50*time.Second, "SluiceQuotaExhaustionPredicted/critical"),
	}}
	var b bytes.Buffer
	_ = Run(ctx, &b, src, false, time.Millisecond, time.Hour, func() time.Time { return clock })
	p, ok := m.Prediction()
	if !ok || p.After != 12*time.Second || p.UsedPercent != 15 || p.Calls != 145 || p.What != "in 1m8s (1m3s-1m17s) rates" {
		t.Errorf("prediction milestone %+v, %v; want the view 12 s after the start at 15%% with its range", p, ok)
	}
	a, ok := m.Alerted()
	if !ok || a.After != 22*time.Second || a.UsedPercent != 27.5 || a.What != "SluiceQuotaExhaustionPredicted/warning" {
		t.Errorf("alert milestone %+v, %v; want the view 22 s after the start at 27.5%%", a, ok)
	}
	out := b.String()
	for _, want := range []string{
		"runaway: first prediction shown 12.0 s after its first call (145 calls), at 15.0% of hourly_tokens/hour: exhausts in 1m8s (1m3s-1m17s) rates\n",
		"runaway: predictive alert SluiceQuotaExhaustionPredicted/warning fired at 27.5% of hourly_tokens/hour, 22.0 s after its first call\n",
	} {
		if strings.Count(out, want) != 1 {
			t.Errorf("plain output has %q %d times, want once:\n%s", want, strings.Count(out, want), out)
		}
	}
	if strings.Index(out, "first prediction") > strings.Index(out, "predictive alert") {
		t.Errorf("the alert's line comes before the prediction's:\n%s", out)
	}
}

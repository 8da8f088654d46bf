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

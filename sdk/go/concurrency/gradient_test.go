package concurrency

import (
	"strings"
	"testing"
	"time"
)

func newGradient(t *testing.T, opts ...GradientOpt) *Gradient {
	t.Helper()
	g, err := NewGradient(append([]GradientOpt{InitialLimit(10), MaxLimit(500)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGradientFindsCapacityAndFollowsIt: against an upstream of capacity
// 50 whose latency grows past it, the limit climbs from 10 to within 10%
// of 50; when the upstream's capacity falls to 25 (slower answers at the
// same concurrency) the limit falls with it, and when capacity returns it
// climbs back.
func TestGradientFindsCapacityAndFollowsIt(t *testing.T) {
	g := newGradient(t)
	now := simulate(g, saturating(50, 100*time.Millisecond), t0, 2*time.Minute, nil)
	if l := g.Limit(); l < 45 || l > 55 {
		t.Fatalf("limit after 2 min against capacity 50 = %d, want 45..55", l)
	}
	now = simulate(g, saturating(25, 100*time.Millisecond), now, time.Minute, nil)
	if l := g.Limit(); l < 22 || l > 30 {
		t.Fatalf("limit after capacity fell to 25 = %d, want 22..30", l)
	}
	simulate(g, saturating(50, 100*time.Millisecond), now, 2*time.Minute, nil)
	if l := g.Limit(); l < 45 || l > 55 {
		t.Fatalf("limit after capacity came back to 50 = %d, want 45..55", l)
	}
}

// TestGradientShrinksOnFailures: fast failures (an upstream answering
// 503 at once) do not slow the window down, but above 10% of calls they
// shrink the limit ×0.8 per window.
func TestGradientShrinksOnFailures(t *testing.T) {
	g := newGradient(t, InitialLimit(100))
	failing := func(n int) (time.Duration, bool) { return 10 * time.Millisecond, n%4 == 0 }
	var limits []int
	simulate(g, failing, t0, 5*time.Second, func(_ time.Time, l int) {
		if len(limits) == 0 || limits[len(limits)-1] != l {
			limits = append(limits, l)
		}
	})
	if len(limits) < 4 || limits[1] != 80 || limits[2] != 64 || limits[3] != 51 {
		t.Fatalf("limits under 25%% fast failures = %v, want 100, 80, 64, 51, ...", limits)
	}
}

// TestGradientHoldsWhenNotTheBottleneck: a window whose concurrency never
// reached half the limit says nothing about the upstream; the limit
// neither grows without bound nor shrinks.
func TestGradientHoldsWhenNotTheBottleneck(t *testing.T) {
	g := newGradient(t, InitialLimit(100))
	for i := range 1000 {
		g.Observe(t0.Add(time.Duration(i)*10*time.Millisecond), Sample{Latency: time.Duration(50+i%7*40) * time.Millisecond, InFlight: 5, Outcome: Success})
	}
	if l := g.Limit(); l != 100 {
		t.Fatalf("limit = %d with 5 calls in flight of 100 allowed, want it held at 100", l)
	}
}

func TestGradientOptionsAreValidated(t *testing.T) {
	_, err := NewGradient(Tolerance(0.5), Smoothing(0), SampleEvery(time.Second, 0), InitialLimit(2000))
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"Tolerance: 0.5 is outside 1..10", "Smoothing: 0", "minSamples 0", "InitialLimit: 2000 is outside MinLimit..MaxLimit (1..1000)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestGradientDoesNotDriftUnderSustainedSaturation: ten minutes of
// uninterrupted saturation — twice BestOf — leave the limit within 10%
// of capacity: the once-a-minute probe window keeps the best latency an
// unqueued one.
func TestGradientDoesNotDriftUnderSustainedSaturation(t *testing.T) {
	g := newGradient(t)
	lowest, highest := 1000, 0
	simulate(g, saturating(50, 100*time.Millisecond), t0, 10*time.Minute, func(now time.Time, l int) {
		if now.Sub(t0) > time.Minute {
			lowest, highest = min(lowest, g.Target()), max(highest, g.Target())
		}
	})
	if lowest < 45 || highest > 55 {
		t.Fatalf("after the first minute the limit ranged %d..%d, want within 45..55", lowest, highest)
	}
}

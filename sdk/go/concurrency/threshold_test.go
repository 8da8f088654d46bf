package concurrency

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// feed gives alg one call per second from `from` for d, each with the
// latency and outcome of at(i).
func feed(alg Algorithm, from time.Time, d time.Duration, at func(i int) (time.Duration, Outcome)) int {
	limit := alg.Limit()
	for i := 0; time.Duration(i)*time.Second < d; i++ {
		lat, o := at(i)
		limit = alg.Observe(from.Add(time.Duration(i)*time.Second), Sample{Latency: lat, InFlight: limit, Outcome: o})
	}
	return limit
}

func constant(lat time.Duration, o Outcome) func(int) (time.Duration, Outcome) {
	return func(int) (time.Duration, Outcome) { return lat, o }
}

func newThreshold(t *testing.T, opts ...ThresholdOpt) *Threshold {
	t.Helper()
	th, err := NewThreshold(append([]ThresholdOpt{InitialLimit(100), MinLimit(10), MaxLimit(200)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// TestThresholdSlowAnswersShrinkEveryTenSeconds: an average
// latency above 2 s multiplies the limit by 0.8 at each 10 s adjustment,
// never between adjustments, and never below the minimum.
func TestThresholdSlowAnswersShrinkEveryTenSeconds(t *testing.T) {
	th := newThreshold(t)
	slow := constant(2100*time.Millisecond, Success)
	if got := feed(th, t0, 10*time.Second, slow); got != 100 {
		t.Fatalf("limit moved to %d within the first 10 s; the rule adjusts only every 10 s", got)
	}
	want := []int{80, 64, 51, 40, 32, 26, 20, 16, 13, 10, 10, 10}
	for i, w := range want {
		from := t0.Add(time.Duration(i+1) * 10 * time.Second)
		if got := feed(th, from, 10*time.Second, slow); got != w {
			t.Fatalf("after adjustment %d the limit is %d, want %d (×0.8, floor 10)", i+1, got, w)
		}
	}
}

// TestThresholdRecoversWhenTheWindowIsFastAgain: after slow answers, the
// limit grows ×1.2 per adjustment once the 60 s window's average falls
// below 500 ms with under 1% errors, up to the maximum.
func TestThresholdRecoversWhenTheWindowIsFastAgain(t *testing.T) {
	th := newThreshold(t)
	// One 3 s call per second for 30 s, then one 100 ms call per second.
	feed(th, t0, 30*time.Second, constant(3*time.Second, Success))
	var seen []int
	for i := range 16 {
		seen = append(seen, feed(th, t0.Add(time.Duration(30+10*i)*time.Second), 10*time.Second, constant(100*time.Millisecond, Success)))
	}
	// Adjustments at 30 s and 40 s see averages of 3 s and 2.275 s
	// (shrink), at 50 s .. 80 s 1.84 s, 1.55 s, 1.07 s, 0.58 s (hold), from
	// 90 s only fast calls (grow ×1.2 on the unrounded limit, to 200).
	want := []int{51, 40, 40, 40, 40, 40, 49, 58, 70, 84, 101, 122, 146, 176, 200, 200}
	if !slices.Equal(seen, want) {
		t.Fatalf("limits after each adjustment = %v, want %v", seen, want)
	}
}

// TestThresholdBoundaries pins the rule's comparisons: strictly above 2 s
// or 10% errors shrinks, strictly below 500 ms and 1% errors grows, the
// band between holds.
func TestThresholdBoundaries(t *testing.T) {
	for _, c := range []struct {
		name     string
		lat      time.Duration
		errEvery int // one failure in errEvery calls; 0 none
		want     int
	}{
		{"2s exactly holds", 2 * time.Second, 0, 100},
		{"just above 2s shrinks", 2*time.Second + time.Millisecond, 0, 80},
		{"500ms exactly holds", 500 * time.Millisecond, 0, 100},
		{"just under 500ms grows", 499 * time.Millisecond, 0, 120},
		{"10% errors holds", 100 * time.Millisecond, 10, 100},
		{"12.5% errors shrinks", 100 * time.Millisecond, 8, 80},
		{"1% errors does not grow", 100 * time.Millisecond, 100, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			th := newThreshold(t)
			// 100 calls per second for 10 s, so error ratios are exact.
			for i := range 1000 {
				o := Success
				if c.errEvery > 0 && i%c.errEvery == 0 {
					o = Failure
				}
				th.Observe(t0.Add(time.Duration(i)*10*time.Millisecond), Sample{Latency: c.lat, InFlight: 50, Outcome: o})
			}
			if got := th.Tick(t0.Add(10 * time.Second)); got != c.want {
				t.Fatalf("limit after one adjustment = %d, want %d", got, c.want)
			}
		})
	}
}

// TestThresholdFailuresShrinkEvenWhenFast: errors above 10% shrink the
// limit although every answer is fast (an upstream answering 429 at once).
func TestThresholdFailuresShrinkEvenWhenFast(t *testing.T) {
	th := newThreshold(t)
	got := feed(th, t0, 21*time.Second, func(i int) (time.Duration, Outcome) {
		if i%5 == 0 {
			return 5 * time.Millisecond, Failure
		}
		return 50 * time.Millisecond, Success
	})
	if got != 64 {
		t.Fatalf("limit after two adjustments with 20%% errors = %d, want 64", got)
	}
}

// TestThresholdForgetsCallsOlderThanTheWindow: the rule runs every 10 s
// whether or not calls finish; slow calls count until they leave the
// 60 s window, a window without calls holds the limit, and fast calls
// after the quiet period grow it again.
func TestThresholdForgetsCallsOlderThanTheWindow(t *testing.T) {
	th := newThreshold(t)
	feed(th, t0, 10*time.Second, constant(10*time.Second, Success))
	if got := th.Tick(t0.Add(70 * time.Second)); got != 26 {
		t.Fatalf("limit after six adjustments over a window holding slow calls = %d, want 26 (100 × 0.8^6)", got)
	}
	if got := th.Tick(t0.Add(5 * time.Minute)); got != 26 {
		t.Fatalf("limit moved to %d over windows without calls", got)
	}
	if got := feed(th, t0.Add(5*time.Minute), 11*time.Second, constant(100*time.Millisecond, Success)); got != 31 {
		t.Fatalf("fast calls after the quiet period: limit %d, want 31 (26.2 × 1.2)", got)
	}
}

func TestThresholdOptionsAreValidated(t *testing.T) {
	_, err := NewThreshold(MinLimit(0), Window(25*time.Second), Factors(1.1, 0.9))
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"MinLimit: 0 is below 1", "Window: 25s must be a whole multiple of AdjustEvery (10s)", "Factors: down 1.1", "Factors: up 0.9"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

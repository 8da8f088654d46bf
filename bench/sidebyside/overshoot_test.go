package sidebyside

import (
	"testing"
	"time"
)

// TestOvershootCountsWhatTheLimiterCertainlyAdmitted: the overshoot the
// comparisons report counts an admission in a span only when its request
// was sent and answered within it, a fixed window by the window the
// limiter named, and a clock-aligned one only when both ends lie in it.
func TestOvershootCountsWhatTheLimiterCertainlyAdmitted(t *testing.T) {
	ms := int64(time.Millisecond)
	// Key 0: 3 admissions inside 100 ms, then one whose answer was read
	// after the span although it was sent inside it.
	events := []event{
		{key: 0, sent: 0, at: 1 * ms, reset: 1},
		{key: 0, sent: 10 * ms, at: 11 * ms, reset: 1},
		{key: 0, sent: 20 * ms, at: 21 * ms, reset: 2},
		{key: 0, sent: 90 * ms, at: 130 * ms, reset: 2},
		{key: 1, sent: 0, at: 1 * ms, reset: 1},
	}
	if got := slidingOvershoot(events, 2, 2, 100*time.Millisecond); got != 0.5 {
		t.Errorf("sliding overshoot %v, want 0.5 (3 certain admissions in 100 ms, limit 2)", got)
	}
	if got := slidingOvershoot(events, 2, 3, 100*time.Millisecond); got != 0 {
		t.Errorf("sliding overshoot %v, want 0: the 4th answer was read after the span", got)
	}
	if got := fixedOvershoot(events, 1); got != 1 {
		t.Errorf("fixed overshoot %v, want 1 (2 admissions in key 0's windows, limit 1)", got)
	}
	// Aligned 100 ms windows: key 0 has 3 certain admissions in [0, 100 ms);
	// the 4th was answered in the next window and counts in neither.
	if got := alignedOvershoot(events, 2, 100*time.Millisecond); got != 0.5 {
		t.Errorf("aligned overshoot %v, want 0.5 (3 certain admissions in one window, limit 2)", got)
	}
	if got := alignedOvershoot(events, 3, 100*time.Millisecond); got != 0 {
		t.Errorf("aligned overshoot %v, want 0: the 4th answer was read in the next window", got)
	}
	if got := alignedOvershoot(events, 1, 10*time.Millisecond); got != 0 {
		t.Errorf("aligned overshoot %v, want 0: in 10 ms windows no key has 2 certain admissions in one", got)
	}
}

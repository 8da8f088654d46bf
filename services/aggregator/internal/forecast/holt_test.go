package forecast

import (
	"math"
	"testing"
)

// noise returns a deterministic pseudo-random factor in [1-amp, 1+amp].
func noise(i int, amp float64) float64 {
	x := uint32(i)*2654435761 + 12345
	x ^= x >> 13
	x *= 0x5bd1e995
	x ^= x >> 15
	return 1 + amp*(2*float64(x%10001)/10000-1)
}

// trueMinutes walks rate(k) forward from minute start until remaining is
// consumed, returning the exact time to exhaustion of the trace.
func trueMinutes(rate func(k int) float64, start int, remaining float64) float64 {
	for k := start; k < start+1_000_000; k++ {
		r := rate(k)
		if r >= remaining {
			return float64(k-start) + remaining/r
		}
		remaining -= r
	}
	return math.Inf(1)
}

func feed(h *Holt, rate func(k int) float64, minutes int) {
	for k := 0; k < minutes; k++ {
		h.Observe(rate(k))
	}
}

func relErr(got, want float64) float64 { return math.Abs(got-want) / want }

func TestSteadyWithinTenPercent(t *testing.T) {
	rate := func(k int) float64 { return 1000 * noise(k, 0.1) }
	var h Holt
	feed(&h, rate, 30)
	for _, remaining := range []float64{10_000, 60_000, 500_000} {
		got, ok := h.MinutesToExhaustion(remaining)
		if !ok {
			t.Fatalf("remaining %v: no prediction after 30 minutes of steady traffic", remaining)
		}
		want := remaining / 1000 // the trace's mean rate
		if e := relErr(got, want); e > 0.10 {
			t.Errorf("remaining %v: predicted %.1f min, true %.1f min, error %.1f%% > 10%%", remaining, got, want, 100*e)
		}
	}
}

func TestRampWithinTenPercent(t *testing.T) {
	rate := func(k int) float64 { return 200 + 20*float64(k) }
	var h Holt
	feed(&h, rate, 40)
	for _, remaining := range []float64{5_000, 50_000, 300_000} {
		got, ok := h.MinutesToExhaustion(remaining)
		if !ok {
			t.Fatalf("no prediction on a ramp")
		}
		want := trueMinutes(rate, 40, remaining)
		if e := relErr(got, want); e > 0.10 {
			t.Errorf("remaining %v: predicted %.2f min, true %.2f min, error %.1f%% > 10%%", remaining, got, want, 100*e)
		}
	}
	// A plain EWMA (no trend) would be far off here: check the trend term
	// is what makes the difference, so this test cannot pass by accident.
	if h.trend < 10 {
		t.Errorf("trend %.2f per minute², want close to the ramp's 20", h.trend)
	}
}

func TestTenfoldStepReflectedWithinTwoMinutes(t *testing.T) {
	const remaining = 200_000
	var h Holt
	feed(&h, func(int) float64 { return 1000 }, 30)
	before, _ := h.MinutesToExhaustion(remaining)
	h.Observe(10_000)
	h.Observe(10_000)
	got, ok := h.MinutesToExhaustion(remaining)
	if !ok {
		t.Fatal("no prediction after the step")
	}
	want := remaining / 10_000.0
	if e := relErr(got, want); e > 0.25 {
		t.Errorf("2 minutes after a 10x step: predicted %.1f min (was %.1f), true %.1f min, error %.0f%% > 25%%", got, before, want, 100*e)
	}
}

func TestBurstDoesNotStick(t *testing.T) {
	const remaining = 100_000
	var h Holt
	feed(&h, func(int) float64 { return 1000 }, 30)
	h.Observe(10_000) // one burst minute
	for i := 0; i < 5; i++ {
		h.Observe(1000)
	}
	got, ok := h.MinutesToExhaustion(remaining)
	if !ok {
		t.Fatal("no prediction after the burst")
	}
	want := remaining / 1000.0
	if e := relErr(got, want); e > 0.25 {
		t.Errorf("5 minutes after a one-minute burst: predicted %.1f min, true %.1f min, error %.0f%% > 25%%", got, want, 100*e)
	}
}

func TestIdleStopsPredicting(t *testing.T) {
	var h Holt
	feed(&h, func(int) float64 { return 1000 }, 30)
	for i := 0; i < 30; i++ {
		h.Observe(0)
	}
	if m, ok := h.MinutesToExhaustion(100_000); ok && m < 10_000 {
		t.Errorf("after 30 idle minutes predicted exhaustion in %.0f min; an idle tenant must not look about to run out", m)
	}
}

func TestNoPredictionFromTooLittleData(t *testing.T) {
	var h Holt
	for i := 0; i < MinSamples-1; i++ {
		h.Observe(1000)
		if _, ok := h.MinutesToExhaustion(1000); ok {
			t.Fatalf("predicted after %d minutes, want none before %d", i+1, MinSamples)
		}
		if _, ok := h.Rate(); ok {
			t.Fatalf("rate after %d minutes, want none before %d", i+1, MinSamples)
		}
	}
	h.Observe(1000)
	if _, ok := h.MinutesToExhaustion(1000); !ok {
		t.Fatalf("no prediction after %d minutes", MinSamples)
	}
}

// TestRangeIsNarrowWhenSteadyAndHoldsTheTruthWhenNoisy: the uncertainty
// an operator reads follows how regular the tenant is, and the true time
// to exhaustion of a noisy trace lies within it.
func TestRangeIsNarrowWhenSteadyAndHoldsTheTruthWhenNoisy(t *testing.T) {
	const remaining = 60_000
	width := func(amp float64) (lo, hi, want float64) {
		rate := func(k int) float64 { return 1000 * noise(k, amp) }
		var h Holt
		feed(&h, rate, 30)
		lo, hi, ok := h.Range(remaining)
		if !ok {
			t.Fatalf("noise %v: no range after 30 minutes", amp)
		}
		return lo, hi, trueMinutes(rate, 30, remaining)
	}
	lo, hi, _ := width(0.01)
	if (hi-lo)/(remaining/1000) > 0.05 {
		t.Errorf("1%% noise: range %.1f..%.1f min, want within 5%% of the 60 min prediction", lo, hi)
	}
	lo, hi, want := width(0.4)
	if want < lo || want > hi {
		t.Errorf("40%% noise: true %.1f min outside the range %.1f..%.1f", want, lo, hi)
	}
	if (hi-lo)/(remaining/1000) < 0.1 {
		t.Errorf("40%% noise: range %.1f..%.1f min is as narrow as a steady tenant's", lo, hi)
	}
	var h Holt
	feed(&h, func(int) float64 { return 1000 }, 2)
	if _, _, ok := h.Range(remaining); ok {
		t.Error("a range before MinSamples minutes")
	}
}

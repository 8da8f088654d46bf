package concurrency

import (
	"testing"
	"time"
)

// The adaptive benchmarks run a simulated upstream of capacity 50 whose
// latency grows in proportion past it (processor sharing: base × n / 50
// with n > 50 calls in flight), under a saturating closed-loop load (a
// call always waits for a free slot), for 10 simulated minutes from a
// limit of 10. Simulated time makes them deterministic and fast; the
// figures are properties of the algorithms, not of the machine.
const (
	benchCapacity = 50
	benchRun      = 10 * time.Minute
)

// settle runs alg against the upstream and reports how many limit changes
// it made before the limit entered ±10% of the capacity for good (-1 if
// it was outside at the end), and the final limit. The gradient's probe
// windows (80% of the limit for one window a minute) are not changes of
// its limit and are not counted.
func settle(alg Algorithm, base time.Duration) (adjustments, final int) {
	adjustments, final, _ = settleCount(alg, base)
	return adjustments, final
}

// settleCount is settle that also returns every limit change of the run;
// the last change is where the limit stopped moving, within ±10% or not.
func settleCount(alg Algorithm, base time.Duration) (adjustments, final, changes int) {
	lo, hi := benchCapacity*9/10, benchCapacity*11/10
	target := alg.Limit
	if g, ok := alg.(*Gradient); ok {
		target = g.Target
	}
	changes, settledAt, last := 0, -1, target()
	simulate(alg, saturating(benchCapacity, base), t0, benchRun, func(time.Time, int) {
		l := target()
		if l == last {
			return
		}
		changes++
		last = l
		switch {
		case l < lo || l > hi:
			settledAt = -1
		case settledAt < 0:
			settledAt = changes
		}
	})
	if last < lo || last > hi {
		settledAt = -1
	}
	return settledAt, last, changes
}

// BenchmarkAdaptiveGradient reports adaptive_gradient_adjustments_to_settle
// and adaptive_gradient_final_limit: the gradient algorithm with its
// defaults, base latency 100 ms.
func BenchmarkAdaptiveGradient(b *testing.B) {
	var adj, final int
	for b.Loop() {
		g, err := NewGradient(InitialLimit(10))
		if err != nil {
			b.Fatal(err)
		}
		adj, final = settle(g, 100*time.Millisecond)
	}
	b.ReportMetric(float64(adj), "adaptive_gradient_adjustments_to_settle")
	b.ReportMetric(float64(final), "adaptive_gradient_final_limit")
}

// BenchmarkAdaptiveThreshold reports adaptive_threshold_adjustments_to_settle
// and adaptive_threshold_final_limit: the Threshold rule with its default thresholds
// (2 s, 500 ms, 10%, 1%; ×0.8, ×1.2 every 10 s over 60 s), base latency
// 400 ms so that the upstream at capacity is under the 500 ms "fast"
// threshold.
//
// The rule does not settle within ±10% of the capacity (-1), and the two
// further figures say why: adaptive_threshold_adjustments_to_stable is the
// number of changes after which its limit never moves again, and
// adaptive_threshold_stable_latency_ms the upstream's latency at that
// limit. The rule raises the limit while the average latency is under
// 500 ms and lowers it only above 2 s; between the two it holds. Past the
// capacity the latency grows with the excess (400 ms × limit / 50), so
// the limit climbs until the latency leaves the "fast" band — above
// 62 calls — and then stays in the dead band for good, well above the
// capacity, with every call queueing inside the upstream. The gradient
// mode, which reacts to any slowdown against the best latency, is the one
// that settles.
func BenchmarkAdaptiveThreshold(b *testing.B) {
	var adj, final, changes int
	const base = 400 * time.Millisecond
	for b.Loop() {
		th, err := NewThreshold(InitialLimit(10))
		if err != nil {
			b.Fatal(err)
		}
		adj, final, changes = settleCount(th, base)
	}
	b.ReportMetric(float64(adj), "adaptive_threshold_adjustments_to_settle")
	b.ReportMetric(float64(final), "adaptive_threshold_final_limit")
	b.ReportMetric(float64(changes), "adaptive_threshold_adjustments_to_stable")
	lat, _ := saturating(benchCapacity, base)(final)
	b.ReportMetric(float64(lat.Milliseconds()), "adaptive_threshold_stable_latency_ms")
}

// BenchmarkAdaptiveLimiterRelease reports adaptive_release_ns: one
// Limiter acquire and release with the gradient algorithm, one core.
func BenchmarkAdaptiveLimiterRelease(b *testing.B) {
	g, err := NewGradient()
	if err != nil {
		b.Fatal(err)
	}
	l := NewLimiter(g)
	b.ReportAllocs()
	for b.Loop() {
		if l.TryAcquire() {
			l.Release(100*time.Millisecond, Success)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "adaptive_release_ns")
}

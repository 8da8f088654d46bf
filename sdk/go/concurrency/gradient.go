package concurrency

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// maxRecent bounds the window averages a Gradient remembers for BestOf.
const maxRecent = 512

// Gradient moves the limit by the ratio of the best recent latency to the
// current one, the idea behind Netflix's concurrency-limits gradient
// limit: an upstream that is not saturated answers at its best latency,
// and one that is saturated queues calls internally, so that its latency
// grows in proportion to the excess concurrency.
//
// Calls are averaged over measurement windows (SampleEvery: at least 1 s
// and 20 calls). When a window closes:
//
//   - more than ErrorsAbove of its calls failed: the limit is multiplied
//     by 0.8 (failures are often fast, so latency alone would miss them);
//   - the window's peak concurrency stayed under half the limit: the
//     limit stays — the upstream was not the bottleneck, so its latency
//     says nothing about the limit;
//   - otherwise gradient = min(1, Tolerance × best / current), clamped to
//     at least 0.5, where current is the window's average latency of
//     successful calls and best the lowest window average of the last
//     BestOf; the new limit is limit × gradient + Headroom(limit).
//     A decrease is applied in part (Smoothing), an increase at once.
//
// The limit stays within MinLimit..MaxLimit. Under a saturating load it
// settles where the upstream's latency has grown by the headroom's share:
// for an upstream whose latency grows in proportion past a capacity C,
// near C × Tolerance + Headroom(C).
//
// Under uninterrupted saturation every window is slowed by the headroom's
// queueing, so the best would rise to the saturated latency once the
// unsaturated windows are older than BestOf, and the limit would creep up.
// To prevent that the gradient probes: once per ProbeEvery (default 1
// min) of saturation, one window runs at 80% of the limit and its latency,
// measured below the upstream's capacity, refreshes the best; the limit
// is not changed by that window. An upstream that became slower for good
// shows it in the probe too, and the best follows.
//
// The window averages calls of every size; latency per generated token
// would be a fairer measure of an LLM upstream's queueing.
type Gradient struct {
	cfg config
	mu  sync.Mutex

	limit float64

	// The open measurement window.
	winStart             time.Time
	calls, errs, success int
	latency              time.Duration // sum over successful calls
	peak                 int

	// recent holds closed windows' average latencies, oldest first, in a
	// ring of maxRecent; see push.
	recent      [maxRecent]windowAvg
	head, count int

	adjustments int
	lastCurrent time.Duration
	lastBest    time.Duration

	// probing is set for one window, run at probeShare of the limit, that
	// refreshes best; lastProbe is when the last one began.
	probing   bool
	lastProbe time.Time
}

// probeShare is the share of the limit a probe window runs at: enough
// below a limit that settled a headroom above capacity to measure the
// upstream unqueued.
const probeShare = 0.8

type windowAvg struct {
	end time.Time
	avg time.Duration
}

// NewGradient returns the gradient algorithm with the defaults (initial
// limit 20, between 1 and 1000; windows of 1 s and 20 calls; tolerance
// 1.0; best of 5 min; smoothing 0.2; headroom √limit / 2; decrease ×0.8
// above 10% errors) changed by opts.
func NewGradient(opts ...GradientOpt) (*Gradient, error) {
	c := defaults()
	for _, o := range opts {
		o.applyGradient(&c)
	}
	if err := c.validateGradient(); err != nil {
		return nil, fmt.Errorf("concurrency.NewGradient: %w", err)
	}
	return &Gradient{cfg: c, limit: float64(c.initial)}, nil
}

// Limit is the current limit (lower during a probe window).
func (g *Gradient) Limit() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.current()
}

// Target is the limit outside probe windows.
func (g *Gradient) Target() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return int(g.limit)
}

func (g *Gradient) current() int {
	if g.probing {
		return max(g.cfg.min, int(g.limit*probeShare))
	}
	return int(g.limit)
}

// Adjustments is how many closed windows changed the (whole) limit.
func (g *Gradient) Adjustments() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.adjustments
}

// Latencies are the current and best latency the last closed window
// compared, for metrics and the live view.
func (g *Gradient) Latencies() (current, best time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastCurrent, g.lastBest
}

// Observe adds s to the open window, closes it when it is old and full
// enough, and returns the limit.
func (g *Gradient) Observe(now time.Time, s Sample) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.Outcome != Success && s.Outcome != Failure {
		return g.current()
	}
	if g.calls == 0 {
		g.winStart = now
	}
	g.calls++
	g.peak = max(g.peak, s.InFlight)
	if s.Outcome == Failure {
		g.errs++
	} else {
		g.success++
		g.latency += s.Latency
	}
	if g.calls >= g.cfg.minSamples && now.Sub(g.winStart) >= g.cfg.sampleEvery {
		g.close(now)
	}
	return g.current()
}

func (g *Gradient) close(now time.Time) {
	c := &g.cfg
	old := g.limit
	next := old
	if g.lastProbe.IsZero() {
		g.lastProbe = now
	}
	saturated := float64(g.peak) >= old/2
	switch {
	case g.probing:
		// The probe window: its latency only refreshes the best.
		g.probing = false
		if g.success > 0 {
			g.push(windowAvg{end: now, avg: g.latency / time.Duration(g.success)})
		}
	case float64(g.errs)/float64(g.calls) > c.errorsAbove:
		next = old * 0.8
	case g.success == 0:
		// Nothing to measure, and errors within bounds: keep the limit.
	default:
		cur := g.latency / time.Duration(g.success)
		g.push(windowAvg{end: now, avg: cur})
		best := g.best(now)
		g.lastCurrent, g.lastBest = cur, best
		if !saturated {
			break // not the bottleneck: latency says nothing about the limit
		}
		grad := 1.0
		if cur > 0 {
			grad = math.Max(0.5, math.Min(1, c.tolerance*float64(best)/float64(cur)))
		}
		next = old*grad + c.headroom(old)
		if next < old {
			next = old*(1-c.smoothing) + next*c.smoothing
		}
	}
	next = math.Max(float64(c.min), math.Min(float64(c.max), next))
	if int(next) != int(old) {
		g.adjustments++
	}
	g.limit = next
	if saturated && now.Sub(g.lastProbe) >= c.probeEvery {
		g.probing, g.lastProbe = true, now
	} else if !saturated {
		g.lastProbe = now // a window below saturation measured the upstream unqueued
	}
	g.calls, g.errs, g.success, g.latency, g.peak = 0, 0, 0, 0, 0
}

// push adds a closed window's average. recent is a monotonic queue: an
// entry is dropped as soon as a later window is at least as fast, since it
// can never be the best again, so the front is always the best and the
// queue rarely holds more than a few entries. When it is full the oldest
// entry goes, shortening BestOf.
func (g *Gradient) push(w windowAvg) {
	for g.count > 0 && g.recent[(g.head+g.count-1)%maxRecent].avg >= w.avg {
		g.count--
	}
	if g.count == maxRecent {
		g.head = (g.head + 1) % maxRecent
		g.count--
	}
	g.recent[(g.head+g.count)%maxRecent] = w
	g.count++
}

// best is the lowest window average that ended within BestOf of now.
func (g *Gradient) best(now time.Time) time.Duration {
	cut := now.Add(-g.cfg.bestOf)
	for g.count > 1 && g.recent[g.head].end.Before(cut) {
		g.head = (g.head + 1) % maxRecent
		g.count--
	}
	return g.recent[g.head].avg
}

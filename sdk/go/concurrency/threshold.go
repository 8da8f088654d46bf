package concurrency

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// maxBuckets bounds Window / AdjustEvery, and so the memory of a
// Threshold.
const maxBuckets = 60

// bucket sums the calls that finished in one AdjustEvery interval.
type bucket struct {
	calls, errors int64
	latency       time.Duration // sum over successful and failed calls
}

// Threshold is a step rule on latency and error thresholds applied to a
// concurrency limit.
// Calls are summed per AdjustEvery interval; at the end of each interval
// the rule looks at the Window that just ended (the last Window/AdjustEvery
// intervals):
//
//   - average latency above SlowAbove, or errors above ErrorsAbove: the
//     limit is multiplied by the down factor (0.8), not below MinLimit;
//   - otherwise average latency below FastBelow and errors below
//     ErrorsBelow: the limit is multiplied by the up factor (1.2), not
//     above MaxLimit;
//   - otherwise, or when the window holds no call, it stays.
//
// The limit is kept as a real number and Limit rounds it down, so that
// repeated ×1.2 from a small limit still grows it (the seed's integer
// rate would stay at 4 for ever). Intervals start at the first Observe;
// time that jumps several intervals ahead runs the rule once for each.
type Threshold struct {
	cfg config
	mu  sync.Mutex
	// limit is the real-valued limit; Limit() is its floor.
	limit   float64
	buckets []bucket
	// cur is the index of the current interval since start; its bucket is
	// buckets[cur%len(buckets)]. next is when it ends.
	cur         int64
	next        time.Time
	started     bool
	adjustments int
}

// NewThreshold returns the rule with the defaults (initial limit
// 20, between 1 and 1000; 60 s window adjusted every 10 s; 2 s and 500 ms
// latency thresholds, 10% and 1% error thresholds; factors 0.8 and 1.2)
// changed by opts.
func NewThreshold(opts ...ThresholdOpt) (*Threshold, error) {
	c := defaults()
	for _, o := range opts {
		o.applyThreshold(&c)
	}
	if err := c.validateThreshold(); err != nil {
		return nil, fmt.Errorf("concurrency.NewThreshold: %w", err)
	}
	return &Threshold{cfg: c, limit: float64(c.initial), buckets: make([]bucket, c.window/c.every)}, nil
}

// Limit is the current limit.
func (t *Threshold) Limit() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int(t.limit)
}

// Adjustments is how many times the rule has changed the limit.
func (t *Threshold) Adjustments() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.adjustments
}

// Observe runs the rule for every interval that ended by now, then adds s
// to the current interval.
func (t *Threshold) Observe(now time.Time, s Sample) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	if s.Outcome == Success || s.Outcome == Failure {
		b := &t.buckets[t.cur%int64(len(t.buckets))]
		b.calls++
		b.latency += s.Latency
		if s.Outcome == Failure {
			b.errors++
		}
	}
	return int(t.limit)
}

// Tick runs the rule for every interval that ended by now, without a
// call, and returns the limit. A Limiter's limit changes only on
// Observe; Tick is for callers that read Limit while no call finishes.
func (t *Threshold) Tick(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	return int(t.limit)
}

func (t *Threshold) advance(now time.Time) {
	if !t.started {
		t.started, t.next = true, now.Add(t.cfg.every)
		return
	}
	n := int64(len(t.buckets))
	for steps := int64(0); !now.Before(t.next); steps++ {
		if steps > n {
			// Beyond a whole window of intervals every bucket is empty and
			// the rule would change nothing: jump to the current interval.
			skip := int64(now.Sub(t.next)/t.cfg.every) + 1
			t.cur += skip
			t.next = t.next.Add(time.Duration(skip) * t.cfg.every)
			clear(t.buckets)
			return
		}
		t.adjust()
		t.cur++
		t.next = t.next.Add(t.cfg.every)
		t.buckets[t.cur%n] = bucket{} // it held the interval that just left the window
	}
}

// adjust applies the rule to the window ending with the current interval.
func (t *Threshold) adjust() {
	var sum bucket
	for _, b := range t.buckets {
		sum.calls += b.calls
		sum.errors += b.errors
		sum.latency += b.latency
	}
	if sum.calls == 0 {
		return
	}
	avg := sum.latency / time.Duration(sum.calls)
	errs := float64(sum.errors) / float64(sum.calls)
	c := &t.cfg
	next := t.limit
	switch {
	case avg > c.slowAbove || errs > c.errorsAbove:
		next = math.Max(float64(c.min), t.limit*c.down)
	case avg < c.fastBelow && errs < c.errorsBelow:
		next = math.Min(float64(c.max), t.limit*c.up)
	}
	if int(next) != int(t.limit) {
		t.adjustments++
	}
	t.limit = next
}

package concurrency

import (
	"container/heap"
	"time"
)

// upstreamModel is a simulated upstream: the latency of a call that
// starts while n calls (itself included) are in flight, and whether it
// fails.
type upstreamModel func(n int) (time.Duration, bool)

// saturating is an upstream with capacity c: up to c calls in flight it
// answers in base; past it, calls share the capacity and take
// base × n / c (processor sharing), so latency grows with the excess.
func saturating(c int, base time.Duration) upstreamModel {
	return func(n int) (time.Duration, bool) {
		if n <= c {
			return base, false
		}
		return time.Duration(float64(base) * float64(n) / float64(c)), false
	}
}

type call struct {
	end     time.Time
	latency time.Duration
	failed  bool
}

type calls []call

func (h calls) Len() int           { return len(h) }
func (h calls) Less(i, j int) bool { return h[i].end.Before(h[j].end) }
func (h calls) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *calls) Push(x any)        { *h = append(*h, x.(call)) }
func (h *calls) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// simulate runs a saturating closed-loop load (there is always a call
// waiting) against up through alg for d of simulated time from start,
// calling each after every finished call with the time and the limit.
// It returns the end time.
func simulate(alg Algorithm, up upstreamModel, start time.Time, d time.Duration, each func(now time.Time, limit int)) time.Time {
	now, end := start, start.Add(d)
	var h calls
	limit := alg.Limit()
	fill := func() {
		for len(h) < limit {
			lat, failed := up(len(h) + 1)
			heap.Push(&h, call{end: now.Add(lat), latency: lat, failed: failed})
		}
	}
	fill()
	for now.Before(end) {
		c := heap.Pop(&h).(call)
		now = c.end
		o := Success
		if c.failed {
			o = Failure
		}
		limit = alg.Observe(now, Sample{Latency: c.latency, InFlight: len(h) + 1, Outcome: o})
		if each != nil {
			each(now, limit)
		}
		fill()
	}
	return now
}

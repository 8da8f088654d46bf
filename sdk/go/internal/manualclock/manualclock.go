// Package manualclock is a clock that moves only when a test says so, for
// the SDK's tests of deadlines, windows and back-offs without sleeping.
package manualclock

import (
	"sort"
	"sync"
	"time"
)

// Clock is a manual clock. Its timers run their functions, on the
// goroutine that calls Advance, once the clock reaches their time.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*Timer
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Timer is a pending function of a Clock.
type Timer struct {
	c    *Clock
	at   time.Time
	f    func()
	done bool
}

// Stop cancels the timer; it reports whether the timer was still pending.
func (t *Timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

// AfterFunc runs f once the clock has advanced by d. Its result is the
// *Timer, typed as the SDK's clock interfaces expect it.
func (c *Clock) AfterFunc(d time.Duration, f func()) interface{ Stop() bool } {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &Timer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// Pending is the number of timers not yet run or stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

// Advance moves the clock by d, running every timer that falls due in
// time order, each with the clock reading its own time.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var next *Timer
		for _, t := range c.timers {
			if !t.done && !t.at.After(end) {
				next = t
				break
			}
		}
		if next == nil {
			break
		}
		next.done = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = end
	live := c.timers[:0]
	for _, t := range c.timers {
		if !t.done {
			live = append(live, t)
		}
	}
	c.timers = live
	c.mu.Unlock()
}

package concurrency

import (
	"sync"
	"sync/atomic"
	"time"
)

// Outcome classifies a finished upstream call for the algorithms (and for
// the upstream breaker, which reads the same classification).
type Outcome uint8

// The outcomes.
const (
	// Success: the upstream answered. A 4xx that is the caller's fault
	// (bad request, unknown model) is a success here: the upstream was
	// healthy enough to say so.
	Success Outcome = iota + 1
	// Failure: the upstream failed or refused for its own reasons — a
	// 5xx, a 429 from the upstream, a timeout, a connection error.
	Failure
	// Ignored: the call says nothing about the upstream (the caller went
	// away, the gateway gave up before sending). Its latency and result
	// are not sampled.
	Ignored
)

// Sample is one finished call as an Algorithm sees it.
type Sample struct {
	// Latency is how long the call held its slot.
	Latency time.Duration
	// InFlight is the number of calls in flight when it finished, itself
	// included: a measure of the concurrency it ran under.
	InFlight int
	Outcome  Outcome
}

// Algorithm decides the limit. Implementations are safe for concurrent
// use and take the time as an argument so that tests can drive them.
type Algorithm interface {
	// Limit is the current limit, at least 1.
	Limit() int
	// Observe records one finished call at now and returns the limit
	// that applies from now on.
	Observe(now time.Time, s Sample) int
}

// Fixed is an Algorithm whose limit never changes.
type Fixed int

// Limit returns f, at least 1.
func (f Fixed) Limit() int { return max(1, int(f)) }

// Observe ignores s.
func (f Fixed) Observe(time.Time, Sample) int { return f.Limit() }

// Limiter counts the calls in flight to one upstream against the limit
// its Algorithm sets. TryAcquire is lock-free; Release takes a mutex for the
// Algorithm's bookkeeping.
type Limiter struct {
	alg      Algorithm
	now      func() time.Time
	inflight atomic.Int64
	limit    atomic.Int64
	onChange func(old, new int)
	mu       sync.Mutex // serialises Observe, the store of its limit and onChange
}

// LimiterOpt configures a Limiter.
type LimiterOpt interface{ applyLimiter(*Limiter) }

type limiterOpt func(*Limiter)

func (o limiterOpt) applyLimiter(l *Limiter) { o(l) }

// Clock replaces time.Now as the time given to the Algorithm.
func Clock(now func() time.Time) LimiterOpt { return limiterOpt(func(l *Limiter) { l.now = now }) }

// OnChange is called after every change of the limit, with the limit
// before and after, for metrics and logs. It runs on the goroutine that
// released the call and must not block.
func OnChange(f func(old, new int)) LimiterOpt {
	return limiterOpt(func(l *Limiter) { l.onChange = f })
}

// NewLimiter returns a Limiter whose limit alg sets.
func NewLimiter(alg Algorithm, opts ...LimiterOpt) *Limiter {
	l := &Limiter{alg: alg, now: time.Now}
	for _, o := range opts {
		o.applyLimiter(l)
	}
	l.limit.Store(int64(alg.Limit()))
	return l
}

// TryAcquire takes a slot when fewer calls than the limit are in flight.
// A false answer takes nothing.
func (l *Limiter) TryAcquire() bool {
	for {
		n := l.inflight.Load()
		if n >= l.limit.Load() {
			return false
		}
		if l.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release returns a slot taken by TryAcquire and gives the call's latency
// and outcome to the Algorithm.
func (l *Limiter) Release(latency time.Duration, o Outcome) {
	if _, fixed := l.alg.(Fixed); fixed || o == Ignored {
		l.inflight.Add(-1)
		return
	}
	l.ReleaseAt(l.now(), latency, o)
}

// ReleaseAt is Release for a caller that already read the clock (now),
// which saves reading it again on every call.
func (l *Limiter) ReleaseAt(now time.Time, latency time.Duration, o Outcome) {
	n := l.inflight.Add(-1) + 1
	if o == Ignored {
		return
	}
	s := Sample{Latency: latency, InFlight: int(n), Outcome: o}
	// Under mu, so that the limit stored is the latest Observe's and
	// onChange sees the changes in the order they happened.
	l.mu.Lock()
	defer l.mu.Unlock()
	nl := int64(l.alg.Observe(now, s))
	if old := l.limit.Swap(nl); old != nl && l.onChange != nil {
		l.onChange(int(old), int(nl))
	}
}

// Limit is the current limit.
func (l *Limiter) Limit() int { return int(l.limit.Load()) }

// InFlight is the number of slots taken.
func (l *Limiter) InFlight() int { return int(l.inflight.Load()) }

// Keyed counts calls in flight per key (a tenant on one upstream) against
// a limit given at each call, so the limit may follow the upstream's
// adaptive one. Keys with nothing in flight take no memory.
type Keyed struct {
	mu sync.Mutex
	n  map[string]int
}

// NewKeyed returns an empty Keyed.
func NewKeyed() *Keyed { return &Keyed{n: map[string]int{}} }

// TryAcquire takes a slot for key when fewer than limit are taken. A
// limit below 1 refuses.
func (k *Keyed) TryAcquire(key string, limit int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := k.n[key]
	if n >= limit {
		return false
	}
	k.n[key] = n + 1
	return true
}

// Release returns a slot of key. Releasing a key with nothing taken does
// nothing.
func (k *Keyed) Release(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch n := k.n[key]; {
	case n > 1:
		k.n[key] = n - 1
	case n == 1:
		delete(k.n, key)
	}
}

// InFlight is the number of slots key holds.
func (k *Keyed) InFlight(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[key]
}

// Keys is the number of keys holding at least one slot.
func (k *Keyed) Keys() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.n)
}

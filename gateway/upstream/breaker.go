package upstream

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gateway/concurrency"
)

// State is a breaker's state.
type State uint8

// The states.
const (
	// Closed: calls flow and are counted.
	Closed State = iota
	// Open: every call is refused until the open time ends.
	Open
	// HalfOpen: a bounded number of probe calls decide between Closed and
	// Open.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Breaker is an upstream's circuit breaker, shared by every tenant that
// calls the upstream through this gateway process. It opens when any of
// these holds:
//
//   - ConsecutiveFailures calls in a row failed (default 10, seed 000);
//   - of at least MinRequests calls (default 20) in the last Window
//     (default 1 min), ErrorRatio or more failed (default 0.5, seed 000);
//   - of as many calls, SlowRatio or more took SlowCall or longer
//     (defaults 0.5 and 10 s, the policy's slow-call breaker defaults).
//
// Open, it refuses every call for the open time (OpenFor, default 30 s),
// then lets Probes calls through (default 5). One failed or slow probe
// reopens it for twice the previous open time, up to MaxOpenFor (default
// 10 min); Probes successful probes close it and reset the open time.
// Safe for concurrent use.
type Breaker struct {
	consecutive      int
	errorRatio       float64
	slowCall         time.Duration
	slowRatio        float64
	minRequests      int
	window           time.Duration
	openFor, maxOpen time.Duration
	probes           int
	now              func() time.Time
	onChange         func(from, to State, why string)
	bucketSpan       time.Duration

	mu       sync.Mutex
	state    State
	until    time.Time     // Open: when half-open begins
	backoff  time.Duration // the open time of the current or next opening
	inRow    int           // consecutive failures while closed
	left     int           // HalfOpen: probes not yet handed out
	passed   int           // HalfOpen: successful probes
	trips    int
	buckets  [breakerBuckets]breakerBucket
	curStart time.Time // start of the newest bucket
	cur      int       // index of the newest bucket
}

// breakerBuckets divides Window; the ratios lag by at most one bucket.
const breakerBuckets = 10

type breakerBucket struct{ calls, failed, slow int }

// BreakerOpt configures a Breaker.
type BreakerOpt interface{ applyBreaker(*Breaker) }

type breakerOpt func(*Breaker)

func (o breakerOpt) applyBreaker(b *Breaker) { o(b) }

// ConsecutiveFailures opens the breaker after n failures in a row
// (default 10; 0 turns this trigger off).
func ConsecutiveFailures(n int) BreakerOpt { return breakerOpt(func(b *Breaker) { b.consecutive = n }) }

// ErrorRatio opens the breaker when at least ratio of the window's calls
// failed (default 0.5; 0 turns this trigger off).
func ErrorRatio(ratio float64) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.errorRatio = ratio })
}

// SlowCalls opens the breaker when at least ratio of the window's calls
// took threshold or longer (defaults 10 s and 0.5; ratio 0 turns this
// trigger off).
func SlowCalls(threshold time.Duration, ratio float64) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.slowCall, b.slowRatio = threshold, ratio })
}

// RatioWindow is the window of the ratios and the calls it must hold
// before a ratio counts (defaults 1 min and 20).
func RatioWindow(window time.Duration, minRequests int) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.window, b.minRequests = window, minRequests })
}

// OpenTime is the first open time and its cap as failed probes double it
// (defaults 30 s and 10 min).
func OpenTime(first, max time.Duration) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.openFor, b.maxOpen = first, max })
}

// Probes is how many calls a half-open breaker lets through, and how many
// must succeed to close it (default 5).
func Probes(n int) BreakerOpt { return breakerOpt(func(b *Breaker) { b.probes = n }) }

// BreakerClock replaces time.Now, for tests.
func BreakerClock(now func() time.Time) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.now = now })
}

// OnStateChange is called on every transition with the reason, for logs,
// metrics and the live view. It runs with the breaker locked and must not
// call it.
func OnStateChange(f func(from, to State, why string)) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.onChange = f })
}

// NewBreaker returns a closed Breaker.
func NewBreaker(opts ...BreakerOpt) (*Breaker, error) {
	b := &Breaker{consecutive: 10, errorRatio: 0.5, slowCall: 10 * time.Second, slowRatio: 0.5,
		minRequests: 20, window: time.Minute, openFor: 30 * time.Second, maxOpen: 10 * time.Minute, probes: 5, now: time.Now}
	for _, o := range opts {
		o.applyBreaker(b)
	}
	var errs []error
	if b.consecutive < 0 || b.consecutive > 1_000_000 {
		errs = append(errs, fmt.Errorf("ConsecutiveFailures: %d is outside 0..1000000", b.consecutive))
	}
	if b.errorRatio < 0 || b.errorRatio > 1 {
		errs = append(errs, fmt.Errorf("ErrorRatio: %v is outside 0..1", b.errorRatio))
	}
	if b.slowRatio < 0 || b.slowRatio > 1 || (b.slowRatio > 0 && b.slowCall <= 0) {
		errs = append(errs, fmt.Errorf("SlowCalls: ratio %v must be within 0..1 and the threshold %v positive", b.slowRatio, b.slowCall))
	}
	if b.window < breakerBuckets*time.Millisecond || b.minRequests < 1 {
		errs = append(errs, fmt.Errorf("RatioWindow: %v and %d calls must be at least %v and 1", b.window, b.minRequests, breakerBuckets*time.Millisecond))
	}
	if b.openFor <= 0 || b.maxOpen < b.openFor {
		errs = append(errs, fmt.Errorf("OpenTime: %v must be positive and at most the cap %v", b.openFor, b.maxOpen))
	}
	if b.probes < 1 || b.probes > 1000 {
		errs = append(errs, fmt.Errorf("Probes: %d is outside 1..1000", b.probes))
	}
	if b.now == nil {
		errs = append(errs, errors.New("BreakerClock: must not be nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("upstream.NewBreaker: %w", err)
	}
	b.backoff = b.openFor
	b.bucketSpan = b.window / breakerBuckets
	return b, nil
}

// Allow decides whether a call may go to the upstream. ok false refuses
// it, retryAfter saying for how long; probe true makes it one of the
// half-open breaker's probes. Every allowed call must be reported to
// Record with the same probe value.
func (b *Breaker) Allow() (probe, ok bool, retryAfter time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	switch b.state {
	case Closed:
		return false, true, 0
	case Open:
		if now.Before(b.until) {
			return false, false, b.until.Sub(now)
		}
		b.set(HalfOpen, fmt.Sprintf("open time %v over; %d probes decide", b.backoff, b.probes))
		b.left, b.passed = b.probes, 0
	}
	if b.left > 0 {
		b.left--
		return true, true, 0
	}
	// Every probe is out; the answer comes within a call's time.
	return false, false, time.Second
}

// Record reports a call Allow let through: its latency and outcome.
// Ignored outcomes (the caller went away) count for nothing, and an
// ignored probe is handed out again.
func (b *Breaker) Record(probe bool, latency time.Duration, o concurrency.Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	bad := o == concurrency.Failure || (b.slowRatio > 0 && latency >= b.slowCall)
	if probe {
		if b.state != HalfOpen {
			return // the probe round ended without it
		}
		switch {
		case o == concurrency.Ignored:
			b.left++
		case bad:
			b.backoff = min(2*b.backoff, b.maxOpen)
			b.open(now, "a probe failed")
		default:
			b.passed++
			if b.passed >= b.probes {
				b.close()
			}
		}
		return
	}
	if b.state != Closed || o == concurrency.Ignored {
		return // calls admitted before the breaker opened say nothing now
	}
	bk := b.bucket(now)
	bk.calls++
	if o == concurrency.Failure {
		bk.failed++
		b.inRow++
	} else {
		b.inRow = 0
	}
	if b.slowRatio > 0 && latency >= b.slowCall {
		bk.slow++
	}
	if b.consecutive > 0 && b.inRow >= b.consecutive {
		b.open(now, fmt.Sprintf("%d consecutive failures", b.inRow))
		return
	}
	var sum breakerBucket
	for _, x := range b.buckets {
		sum.calls += x.calls
		sum.failed += x.failed
		sum.slow += x.slow
	}
	if sum.calls < b.minRequests {
		return
	}
	if r := float64(sum.failed) / float64(sum.calls); b.errorRatio > 0 && r >= b.errorRatio {
		b.open(now, fmt.Sprintf("%d of %d calls failed in %v", sum.failed, sum.calls, b.window))
	} else if r := float64(sum.slow) / float64(sum.calls); b.slowRatio > 0 && r >= b.slowRatio {
		b.open(now, fmt.Sprintf("%d of %d calls took %v or longer in %v", sum.slow, sum.calls, b.slowCall, b.window))
	}
}

// bucket returns the bucket for now, rotating out those older than the
// window.
func (b *Breaker) bucket(now time.Time) *breakerBucket {
	if b.curStart.IsZero() {
		b.curStart = now
	}
	for steps := 0; now.Sub(b.curStart) >= b.bucketSpan; steps++ {
		if steps >= breakerBuckets {
			clear(b.buckets[:])
			b.curStart = now
			break
		}
		b.cur = (b.cur + 1) % breakerBuckets
		b.buckets[b.cur] = breakerBucket{}
		b.curStart = b.curStart.Add(b.bucketSpan)
	}
	return &b.buckets[b.cur]
}

func (b *Breaker) open(now time.Time, why string) {
	b.until = now.Add(b.backoff)
	b.trips++
	b.set(Open, fmt.Sprintf("%s; open for %v", why, b.backoff))
}

func (b *Breaker) close() {
	b.backoff, b.inRow = b.openFor, 0
	clear(b.buckets[:])
	b.curStart = time.Time{}
	b.set(Closed, fmt.Sprintf("%d probes succeeded", b.probes))
}

func (b *Breaker) set(s State, why string) {
	from := b.state
	b.state = s
	if b.onChange != nil && from != s {
		b.onChange(from, s, why)
	}
}

// BreakerStats is a snapshot of a Breaker.
type BreakerStats struct {
	State State
	// Until is when an open breaker half-opens.
	Until time.Time
	// OpenFor is the open time of the current opening (Open) or of the
	// last one (HalfOpen); a failed probe doubles it for the next.
	OpenFor time.Duration
	// InRow is the consecutive failures counted while closed.
	InRow int
	// Trips is how many times the breaker opened.
	Trips int
}

// Stats returns a snapshot. An open breaker whose open time is over
// reports HalfOpen, as the next Allow will make it.
func (b *Breaker) Stats() BreakerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BreakerStats{State: b.state, Until: b.until, OpenFor: b.backoff, InRow: b.inRow, Trips: b.trips}
	if s.State == Open && !b.now().Before(b.until) {
		s.State = HalfOpen
	}
	return s
}

package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/periodic"
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
//   - ConsecutiveFailures calls in a row failed (default 10);
//   - of at least MinRequests calls (default 20) in the last Window
//     (default 1 min), ErrorRatio or more failed (default 0.5);
//   - of as many calls, SlowRatio or more took SlowCall or longer
//     (defaults 0.5 and 10 s, the policy's slow-call breaker defaults).
//
// Open, it refuses every call for the open time (OpenFor, default 30 s),
// then lets Probes calls through (default 5). One failed or slow probe
// reopens it for twice the previous open time, up to MaxOpenFor (default
// 10 min); Probes successful probes close it and reset the open time.
//
// With FleetWide the state is shared through Redis by every gateway
// process (see Fleet). A fleet-wide breaker holds its lock while it asks
// Redis for a probe, which happens only once its open time is over. Each
// fleet probe has a deadline, ProbeTimeout plus ProbeMargin after it was
// handed out: a probe whose result has not reached Redis by then (its
// gateway died, or every call reporting it failed) is handed out again,
// so no lost probe holds the fleet half-open. A report that fails is
// sent again by Run, off the request path, until it is past that
// deadline: one slow Redis answer must not leave the fleet half-open,
// refusing every call, for the probes' whole deadline.
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
	fleet            *Fleet
	fleetPoll        time.Duration
	onFleetError     func(error)
	probeTimeout     time.Duration

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

	// With a Fleet: the round of the fleet's opening this process follows,
	// and when it may next ask the fleet for a probe after all were out.
	round       int64
	nextAsk     time.Time
	fleetErrors int
	// held is the fleet probes of round this process was handed and has
	// not reported, oldest first; Record reports the oldest (the calls are
	// alike, and each id only frees or counts one place).
	held []int64
	// elsewhere: half-open with the fleet's probes out in other
	// processes, as of the last answer from Redis; elsewhereDue: when
	// they are past their deadline, after which a process that lost Redis
	// probes on its own.
	elsewhere    bool
	elsewhereDue time.Time
	// unsent is the probe results whose report to Redis failed, oldest
	// first, which Run sends again (see recordFleet).
	unsent []unsentResult
}

// unsentResult is a probe's result the fleet has not received.
type unsentResult struct {
	at        time.Time // when the probe ended
	round, id int64
	result    string
}

// maxUnsent bounds Breaker.unsent. When it is full the oldest result is
// dropped: its probe's place is freed at the probe's deadline anyway, and
// a newer failure of the same round reopens the breaker as well.
const maxUnsent = 64

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

// ProbeTimeout is the longest a probe call may take: the upstream call's
// own timeout (default 10 min, the policy's default upstream timeout;
// 1 s to 24 h; 0 keeps the default). A fleet-wide breaker frees a probe
// whose result has not come ProbeTimeout + ProbeMargin after it was
// handed out, for any gateway to take: a shorter value recovers sooner
// from a gateway that died holding probes, one shorter than the calls
// lets a slow probe's place be taken by a second probe. A process that
// follows the fleet's half-open breaker and loses Redis probes on its
// own once the same deadline has passed since Redis last answered it.
func ProbeTimeout(d time.Duration) BreakerOpt {
	return breakerOpt(func(b *Breaker) {
		if d != 0 {
			b.probeTimeout = d
		}
	})
}

// ProbeMargin is added to ProbeTimeout for a fleet probe's deadline: the
// time to report a result to Redis and the clock skew between gateways.
const ProbeMargin = 30 * time.Second

// FleetWide shares the breaker's state with every gateway process through
// f (see Fleet): a process that trips opens the fleet's breaker, probes
// are counted fleet-wide, and Run (Guard.Run runs it) follows
// the fleet's state every poll (default 1 s; 0 keeps the default). While
// Redis is unreachable the breaker works on its own.
func FleetWide(f *Fleet, poll time.Duration) BreakerOpt {
	return breakerOpt(func(b *Breaker) {
		b.fleet = f
		if poll > 0 {
			b.fleetPoll = poll
		}
	})
}

// OnFleetError is called with each failed Redis call of a fleet-wide
// breaker; it must not block.
func OnFleetError(f func(error)) BreakerOpt {
	return breakerOpt(func(b *Breaker) { b.onFleetError = f })
}

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
		minRequests: 20, window: time.Minute, openFor: 30 * time.Second, maxOpen: 10 * time.Minute, probes: 5, now: time.Now,
		fleetPoll: time.Second, probeTimeout: 10 * time.Minute}
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
	if b.probeTimeout < time.Second || b.probeTimeout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("ProbeTimeout: %v is outside 1s..24h", b.probeTimeout))
	}
	if b.fleetPoll < 10*time.Millisecond || b.fleetPoll > time.Minute {
		errs = append(errs, fmt.Errorf("FleetWide: poll %v is outside 10ms..1m", b.fleetPoll))
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
	if b.state == Closed {
		return false, true, 0 // without reading the clock: the common case
	}
	now := b.now()
	switch b.state {
	case Open:
		if now.Before(b.until) {
			return false, false, b.until.Sub(now)
		}
	}
	if b.fleet != nil {
		if probe, ok, retry, done := b.allowFleet(now); done {
			return probe, ok, retry
		}
	}
	if b.state == Open {
		b.set(HalfOpen, fmt.Sprintf("open time %v over; %d probes decide", b.backoff, b.probes))
		b.left, b.passed = b.probes, 0
	}
	if b.elsewhere && !now.Before(b.elsewhereDue) {
		// Redis is away and the probes other processes held are past
		// their deadline: this process probes on its own.
		b.elsewhere = false
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
	b.record(b.now(), probe, latency, o)
}

// record is Record at now, for a caller that already read the clock.
func (b *Breaker) record(now time.Time, probe bool, latency time.Duration, o concurrency.Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bad := o == concurrency.Failure || (b.slowRatio > 0 && latency >= b.slowCall)
	if probe {
		if b.state != HalfOpen {
			return // the probe round ended without it
		}
		if b.fleet != nil && b.recordFleet(now, bad, o) {
			return
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
	b.elsewhere = false
	b.trips++
	b.set(Open, fmt.Sprintf("%s; open for %v", why, b.backoff))
	if b.fleet != nil {
		// Open the fleet's breaker too, or follow it if another process
		// opened it first.
		if fs, err := b.fleet.trip(now, b.fleetTTL(), b.openFor); err != nil {
			b.fleetFailed(err)
		} else {
			b.adopt(fs, now)
		}
	}
}

// fleetTTL is how long the fleet's hash outlives its last use: long
// enough for the longest opening and then some.
func (b *Breaker) fleetTTL() time.Duration { return 2*b.maxOpen + time.Minute }

func (b *Breaker) fleetFailed(err error) {
	b.fleetErrors++
	if b.onFleetError != nil {
		b.onFleetError(fmt.Errorf("upstream: fleet breaker %s: %w", b.fleet.keys[0], err))
	}
}

// allowFleet asks the fleet for a probe once this process's open time is
// over (or while half-open). done false means Redis failed and the local
// rules decide.
func (b *Breaker) allowFleet(now time.Time) (probe, ok bool, retry time.Duration, done bool) {
	if now.Before(b.nextAsk) {
		return false, false, b.nextAsk.Sub(now), true
	}
	id, fs, err := b.fleet.probe(now, b.fleetTTL(), b.probes, b.probeTimeout+ProbeMargin)
	if err != nil {
		b.fleetFailed(err)
		return false, false, 0, false
	}
	b.adopt(fs, now)
	switch {
	case id > 0:
		if len(b.held) >= b.probes {
			// Probes this process never reported: past their deadline
			// the fleet handed them out again, so the oldest id is stale.
			b.held = b.held[1:]
		}
		b.held = append(b.held, id)
		return true, true, 0, true
	case b.state == Closed:
		return false, true, 0, true
	case b.state == Open:
		return false, false, b.until.Sub(now), true
	}
	// Half-open with every probe out: ask again shortly, not on every call.
	b.nextAsk = now.Add(250 * time.Millisecond)
	return false, false, time.Second, true
}

// recordFleet reports a probe's result to the fleet and follows the
// answer; false means Redis failed and the local rules decide.
func (b *Breaker) recordFleet(now time.Time, bad bool, o concurrency.Outcome) bool {
	result := "ok"
	switch {
	case o == concurrency.Ignored:
		result = "ignored"
	case bad:
		result = "fail"
	}
	var id int64
	if len(b.held) > 0 {
		id, b.held = b.held[0], b.held[1:]
	}
	fs, err := b.fleet.result(now, b.fleetTTL(), b.round, id, result, b.probes, b.openFor, b.maxOpen)
	if err != nil {
		b.fleetFailed(err)
		if len(b.unsent) == maxUnsent {
			b.unsent = b.unsent[1:]
		}
		b.unsent = append(b.unsent, unsentResult{at: now, round: b.round, id: id, result: result})
		return false
	}
	b.adopt(fs, now)
	return true
}

// resend reports the unsent probe results again, oldest first, stopping
// at the first that fails. A result is reported as of when its probe
// ended, so the fleet judges it against the probe's deadline as it would
// have then; one past that deadline is dropped (the fleet has freed its
// place). The fleet ignores a result of a round that is over, so a late
// one cannot undo what happened since.
func (b *Breaker) resend(now time.Time) {
	for len(b.unsent) > 0 {
		r := b.unsent[0]
		if now.Sub(r.at) >= b.probeTimeout+ProbeMargin {
			b.unsent = b.unsent[1:]
			continue
		}
		fs, err := b.fleet.result(r.at, b.fleetTTL(), r.round, r.id, r.result, b.probes, b.openFor, b.maxOpen)
		if err != nil {
			b.fleetFailed(err)
			return
		}
		b.unsent = b.unsent[1:]
		b.adopt(fs, now)
	}
}

// adopt makes this process follow the fleet's state.
func (b *Breaker) adopt(fs fleetState, now time.Time) {
	if fs.round != b.round || fs.state != HalfOpen {
		b.held = b.held[:0] // the probes of a round that is over
	}
	b.round = fs.round
	switch fs.state {
	case Closed:
		if b.state != Closed {
			b.close()
		}
	case Open:
		b.until, b.backoff = fs.until, fs.backoff
		if b.state != Open {
			b.trips++
			b.set(Open, fmt.Sprintf("the fleet's breaker is open until %s (open time %v)", fs.until.UTC().Format(time.RFC3339), fs.backoff))
		}
	case HalfOpen:
		b.backoff = fs.backoff
		if b.state != HalfOpen {
			// The fleet hands out the probes; none are left here.
			b.left, b.passed = 0, 0
			b.elsewhere = true
			b.set(HalfOpen, "the fleet's breaker is half-open")
		}
		if b.elsewhere {
			b.elsewhereDue = now.Add(b.probeTimeout + ProbeMargin)
		}
	}
	if fs.state != HalfOpen {
		b.elsewhere = false
	}
}

// Run follows the fleet's state every poll until ctx ends, so that a
// process that saw no failure itself opens with the fleet, and closes
// when the fleet's probes succeeded elsewhere; each poll first sends again
// the probe results whose report failed. Without FleetWide it returns at
// once. It returns nil; Redis errors go to OnFleetError.
func (b *Breaker) Run(ctx context.Context) error {
	if b.fleet == nil {
		return nil
	}
	periodic.Every(ctx, b.fleetPoll, b.sync)
	return nil
}

// sync sends the unsent probe results, then reads the fleet's state once
// and follows it.
func (b *Breaker) sync() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.resend(now)
	fs, err := b.fleet.read(now, b.fleetTTL())
	if err != nil {
		b.fleetFailed(err)
		return
	}
	if fs.state == Closed && b.state == Closed {
		return
	}
	if fs.state == Closed && fs.round < b.round {
		return // an older answer than what this process knows
	}
	b.adopt(fs, now)
}

func (b *Breaker) close() {
	b.backoff, b.inRow = b.openFor, 0
	b.elsewhere = false
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
	// Trips is how many times the breaker opened (here or, fleet-wide,
	// as this process learnt).
	Trips int
	// FleetErrors counts failed Redis calls of a fleet-wide breaker.
	FleetErrors int
}

// Stats returns a snapshot. An open breaker whose open time is over
// reports HalfOpen, as the next Allow will make it.
func (b *Breaker) Stats() BreakerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BreakerStats{State: b.state, Until: b.until, OpenFor: b.backoff, InRow: b.inRow, Trips: b.trips, FleetErrors: b.fleetErrors}
	if s.State == Open && !b.now().Before(b.until) {
		s.State = HalfOpen
	}
	return s
}

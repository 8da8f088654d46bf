package priority

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
)

// Gate is the capacity a Queue hands out: the upstream's concurrency
// limit. *concurrency.Limiter is the in-process one.
type Gate interface {
	// TryAcquire takes a slot when one is free; false takes nothing.
	TryAcquire() bool
	// Release returns a slot with the call's latency and outcome.
	Release(latency time.Duration, o concurrency.Outcome)
	// Limit is the current number of slots.
	Limit() int
	// InFlight is the number of slots taken.
	InFlight() int
}

// Clock is the time source of a Queue; the real clock is the default.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) interface{ Stop() bool }
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) interface{ Stop() bool } {
	return time.AfterFunc(d, f)
}

// Queue is a bounded admission queue in front of one upstream's Gate.
//
// A request that finds no one waiting and a free slot is admitted at
// once, without a lock. Otherwise it waits in its class's FIFO, and every
// released slot goes to the next request chosen by:
//
//   - critical first: while a critical request waits, it gets the slot;
//   - among the other classes, strict priority (high, then normal, then
//     low), except that a lower class is never starved: each has a
//     minimum share (defaults: high 15%, normal 10%, low 5%). Each time a
//     waiting class is passed over for high, normal or low it earns its
//     share of a turn, and once it has earned a whole turn it takes the
//     next slot critical does not. So of the slots critical leaves, a
//     class that keeps waiting gets at least about share/(1+share) — low
//     one in 21, normal one in 11, high one in 7.7 — however busy the
//     classes above it are. A class that stops waiting loses what it had
//     earned, so an idle class cannot save up a burst.
//
// Critical is exempt so that its wait depends only on critical traffic
// (the target: critical p99 wait ≤ 100 ms under 2× overload). The
// price: critical traffic alone that saturates the upstream starves the
// other classes; which tenants and keys may be critical (policy, Grant)
// and their concurrency limits bound it.
//
// Bounds:
//
//   - at most MaxWaiting requests wait (default 1,000). When
//     full, a newcomer evicts the newest request of the lowest class
//     waiting, if that class is below its own; otherwise the newcomer is
//     refused (QueueFull). So a class is shed only while no lower class
//     waits.
//   - each request has a deadline: the latest time its call may start,
//     at most MaxWait (default 30 s) away. On arrival the Queue estimates
//     the wait — the requests ahead of it (its class and above) divided
//     by the observed service rate (slots ÷ mean time a slot is held),
//     less the share lower classes take — and refuses at once (Deadline)
//     when the estimate exceeds the deadline. A request that still waits
//     until its deadline is refused then (Expired), never later.
//
// No wake-up is lost: a slot released while a newcomer is between its
// failed try and joining the queue is taken by the newcomer's own retry
// once it is queued, and every refusal (expiry, shedding, cancellation)
// hands out any slot that is free while others wait. So no interleaving
// leaves a free slot beside a waiting request until the next call ends
// (TestQueueReleaseBeforeTheNewcomerQueuesIsNotLost,
// TestQueueEveryWaiterProgressesUnderRace).
//
// Refusals carry 503 semantics and a Retry-After (see Decision).
type Queue struct {
	gate       Gate
	clock      Clock
	maxWaiting int
	maxWait    time.Duration
	shares     [schemas.NumPriorities]int64 // per-mille of a turn earned per pass-over

	// nwait mirrors the number waiting for the lock-free fast path.
	nwait atomic.Int64
	// holdNS is the mean time a slot is held, an exponentially weighted
	// moving average in ns; 0 until the first release.
	holdNS atomic.Int64

	// admitted and refused count decisions per class; refused leaves out
	// cancellations.
	admitted, refused [schemas.NumPriorities]atomic.Uint64

	mu      sync.Mutex
	classes [schemas.NumPriorities]fifo
	credit  [schemas.NumPriorities]int64

	optErrs []error // from options, reported by NewQueue

	// pollEvery > 0 retries dispatch while requests wait, for a Gate whose
	// slots other processes also free; polling says a retry is armed.
	pollEvery time.Duration
	polling   bool

	// beforePush, when set by a test, runs in Acquire with q.mu held after
	// the newcomer found no free slot and before it joins the queue: the
	// window in which a release would find no one to wake.
	beforePush func()
}

// turn is a whole turn in the per-mille units of shares and credit.
const turn = 1000

// QueueOpt configures a Queue.
type QueueOpt interface{ applyQueue(*Queue) }

type queueOpt func(*Queue)

func (o queueOpt) applyQueue(q *Queue) { o(q) }

// MaxWaiting bounds the requests waiting (default 1,000).
func MaxWaiting(n int) QueueOpt { return queueOpt(func(q *Queue) { q.maxWaiting = n }) }

// MaxWait bounds how long any request waits (default 30 s); a request
// without a deadline gets this one.
func MaxWait(d time.Duration) QueueOpt { return queueOpt(func(q *Queue) { q.maxWait = d }) }

// MinShare sets the minimum share of the slots critical leaves that
// class c gets while it waits (defaults: high 0.15, normal 0.10, low
// 0.05). 0 makes the class strictly subordinate to the classes above it.
// Critical has no share: it always goes first. The shares must add up to
// at most 0.5.
func MinShare(c schemas.Priority, share float64) QueueOpt {
	return queueOpt(func(q *Queue) {
		switch {
		case !c.Valid():
			q.optErrs = append(q.optErrs, fmt.Errorf("MinShare: %q is not a class", string(c)))
		case c == schemas.PriorityCritical:
			q.optErrs = append(q.optErrs, errors.New("MinShare(critical): critical has no share, it always goes first"))
		case !(share >= 0 && share <= 0.5):
			q.optErrs = append(q.optErrs, fmt.Errorf("MinShare(%s): %v is outside 0..0.5", c, share))
		default:
			q.shares[c.Index()] = int64(share*turn + 0.5)
		}
	})
}

// PollEvery makes the Queue retry its waiting requests every d while any
// wait (default 20 ms for a Gate with a Remote method answering true, such
// as concurrency.Shared, whose slots other processes free; off otherwise,
// since a local Gate's slots come back only through Release, which
// dispatches at once).
func PollEvery(d time.Duration) QueueOpt { return queueOpt(func(q *Queue) { q.pollEvery = d }) }

// WithClock replaces the real clock, for tests.
func WithClock(c Clock) QueueOpt { return queueOpt(func(q *Queue) { q.clock = c }) }

// NewQueue returns a Queue handing out g's slots.
func NewQueue(g Gate, opts ...QueueOpt) (*Queue, error) {
	q := &Queue{gate: g, clock: realClock{}, maxWaiting: 1000, maxWait: 30 * time.Second}
	if r, ok := g.(interface{ Remote() bool }); ok && r.Remote() {
		q.pollEvery = 20 * time.Millisecond
	}
	q.shares[schemas.PriorityHigh.Index()], q.shares[schemas.PriorityNormal.Index()], q.shares[schemas.PriorityLow.Index()] = 150, 100, 50
	for _, o := range opts {
		o.applyQueue(q)
	}
	errs := q.optErrs
	if g == nil {
		errs = append(errs, errors.New("gate: must not be nil"))
	}
	if q.maxWaiting < 0 || q.maxWaiting > 1_000_000 {
		errs = append(errs, fmt.Errorf("MaxWaiting: %d is outside 0..1000000", q.maxWaiting))
	}
	if q.maxWait < time.Millisecond || q.maxWait > time.Hour {
		errs = append(errs, fmt.Errorf("MaxWait: %v is outside 1ms..1h", q.maxWait))
	}
	var sum int64
	for _, s := range q.shares {
		sum += s
	}
	if sum > turn/2 {
		errs = append(errs, fmt.Errorf("MinShare: the shares add up to %v, more than 0.5", float64(sum)/turn))
	}
	if q.clock == nil {
		errs = append(errs, errors.New("WithClock: must not be nil"))
	}
	if q.pollEvery < 0 || q.pollEvery > time.Minute {
		errs = append(errs, fmt.Errorf("PollEvery: %v is outside 0..1m", q.pollEvery))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("priority.NewQueue: %w", err)
	}
	return q, nil
}

// Permit is a slot of the upstream held by an admitted request. Release
// it exactly once, when the upstream call has finished.
type Permit struct {
	q     *Queue
	start time.Time
}

// Release returns the slot with the call's outcome: the Gate's algorithm
// learns from it, the Queue's service-rate estimate too (unless the
// outcome is Ignored), and the next waiting request gets the slot.
// Releasing the zero Permit does nothing.
func (p Permit) Release(o concurrency.Outcome) {
	if p.q != nil {
		p.ReleaseAt(p.q.clock.Now(), o)
	}
}

// Start is when the Permit was granted; zero for the zero Permit.
func (p Permit) Start() time.Time { return p.start }

// ReleaseAt is Release for a caller that already read the clock (now).
func (p Permit) ReleaseAt(now time.Time, o concurrency.Outcome) {
	q := p.q
	if q == nil {
		return
	}
	held := now.Sub(p.start)
	if o != concurrency.Ignored {
		q.observeHold(held)
	}
	if r, ok := q.gate.(interface {
		ReleaseAt(time.Time, time.Duration, concurrency.Outcome)
	}); ok {
		r.ReleaseAt(now, held, o)
	} else {
		q.gate.Release(held, o)
	}
	// The slot is back before nwait is read, and Acquire counts a
	// newcomer in nwait before it tries the Gate again: so either this
	// load sees the newcomer and dispatches, or the newcomer's own
	// dispatch finds the slot. Neither can miss it.
	if q.nwait.Load() > 0 {
		q.mu.Lock()
		q.dispatch()
		q.mu.Unlock()
	}
}

// Acquire asks for a slot for a request of class c that must start by
// deadline (zero: MaxWait from now; later than that: MaxWait from now). It
// returns at once when a slot is free or the request is refused, and
// otherwise when the request is admitted, shed, reaches its deadline or
// ctx ends. Only an admitted Decision comes with a Permit. An invalid
// class is taken as normal.
func (q *Queue) Acquire(ctx context.Context, c schemas.Priority, deadline time.Time) (Permit, Decision) {
	if !c.Valid() {
		c = schemas.PriorityNormal
	}
	ci := c.Index()
	if q.nwait.Load() == 0 && q.gate.TryAcquire() {
		return q.admitNow(ci, c)
	}
	now := q.clock.Now()
	if latest := now.Add(q.maxWait); deadline.IsZero() || deadline.After(latest) {
		deadline = latest
	}
	q.mu.Lock()
	if q.classesEmpty() && q.gate.TryAcquire() {
		q.mu.Unlock()
		return q.admitNow(ci, c)
	}
	est, known := q.estimate(ci)
	if (known && now.Add(est).After(deadline)) || !deadline.After(now) {
		q.refused[ci].Add(1)
		q.mu.Unlock()
		return Permit{}, Decision{Reason: Deadline, Priority: c, Estimate: est, RetryAfter: max(time.Second, est)}
	}
	if int(q.nwait.Load()) >= q.maxWaiting {
		victim := q.lowestBelow(ci)
		if victim == nil {
			q.refused[ci].Add(1)
			ra := max(time.Second, q.drainTime())
			q.mu.Unlock()
			return Permit{}, Decision{Reason: QueueFull, Priority: c, Estimate: est, RetryAfter: ra}
		}
		q.refuse(victim, Shed, now)
	}
	w := &waiter{class: c, enq: now, ready: make(chan struct{}, 1)}
	if q.beforePush != nil {
		q.beforePush()
	}
	q.push(w)
	// A slot released since TryAcquire failed found no one waiting
	// (ReleaseAt dispatches only when nwait > 0), so it may be free now.
	// Now that w is counted in nwait, every later release dispatches;
	// this dispatch catches the earlier ones. It may admit w at once, or
	// a waiter the rules put before it.
	q.dispatch()
	if w.state == waiting {
		w.timer = q.clock.AfterFunc(deadline.Sub(now), func() { q.expire(w) })
		if q.pollEvery > 0 && !q.polling {
			q.polling = true
			q.clock.AfterFunc(q.pollEvery, q.poll)
		}
	}
	q.mu.Unlock()

	select {
	case <-w.ready:
	case <-ctx.Done():
		q.mu.Lock()
		if w.state == waiting {
			q.refuse(w, Canceled, q.clock.Now())
		}
		q.mu.Unlock()
		<-w.ready
		if w.state == granted {
			// Admitted as the context ended: give the slot back unused.
			Permit{q: q, start: q.clock.Now()}.Release(concurrency.Ignored)
			return Permit{}, Decision{Reason: Canceled, Priority: c, Waited: w.waited, Estimate: est}
		}
	}
	if w.state == granted {
		return Permit{q: q, start: w.at}, Decision{Reason: Admitted, Priority: c, Waited: w.waited, Estimate: est}
	}
	return Permit{}, Decision{Reason: w.reason, Priority: c, Waited: w.waited, Estimate: est, RetryAfter: w.retryAfter}
}

func (q *Queue) admitNow(ci int, c schemas.Priority) (Permit, Decision) {
	q.admitted[ci].Add(1)
	return Permit{q: q, start: q.clock.Now()}, Decision{Reason: Admitted, Priority: c}
}

// observeHold folds one hold time into the moving average (weight 1/16).
func (q *Queue) observeHold(d time.Duration) {
	for {
		old := q.holdNS.Load()
		nv := int64(d)
		if old != 0 {
			nv = old + (int64(d)-old)/16
		}
		if nv < 1 {
			nv = 1
		}
		if q.holdNS.CompareAndSwap(old, nv) {
			return
		}
	}
}

// serviceRate is slots freed per second at the current limit, or 0 when
// no slot has been released yet.
func (q *Queue) serviceRate() float64 {
	h := q.holdNS.Load()
	if h == 0 {
		return 0
	}
	return float64(q.gate.Limit()) / time.Duration(h).Seconds()
}

// estimate is the expected wait of a request of class index ci arriving
// now: one slot per request ahead of it (its class and above) and itself,
// at the service rate less the share the waiting lower classes take from
// it (none from critical). Must hold q.mu.
func (q *Queue) estimate(ci int) (time.Duration, bool) {
	mu := q.serviceRate()
	if mu == 0 {
		return 0, false
	}
	ahead := 1
	steal := 0.0
	for i := range schemas.NumPriorities {
		n := q.classes[i].n
		switch {
		case i >= ci:
			ahead += n
		case n > 0 && q.shares[i] > 0 && ci != schemas.PriorityCritical.Index():
			// Passed over 1/s times, it takes the next: s/(1+s) of slots.
			s := float64(q.shares[i]) / turn
			steal += s / (1 + s)
		}
	}
	return time.Duration(float64(ahead) / (mu * (1 - steal)) * float64(time.Second)), true
}

// drainTime is how long the whole queue takes to drain at the service
// rate, the Retry-After of a request refused for a full queue.
func (q *Queue) drainTime() time.Duration {
	mu := q.serviceRate()
	if mu == 0 {
		return time.Second
	}
	return time.Duration(float64(q.nwait.Load()) / mu * float64(time.Second))
}

func (q *Queue) classesEmpty() bool { return q.nwait.Load() == 0 }

// lowestBelow is the newest waiter of the lowest class below index ci,
// or nil.
func (q *Queue) lowestBelow(ci int) *waiter {
	for i := range ci {
		if q.classes[i].tail != nil {
			return q.classes[i].tail
		}
	}
	return nil
}

// dispatch hands free slots to waiters. Must hold q.mu.
func (q *Queue) dispatch() {
	for q.nwait.Load() > 0 && q.gate.TryAcquire() {
		w := q.classes[q.pick()].head
		q.remove(w)
		now := q.clock.Now()
		w.state, w.at, w.waited = granted, now, now.Sub(w.enq)
		q.admitted[w.class.Index()].Add(1)
		if w.timer != nil {
			w.timer.Stop()
		}
		w.ready <- struct{}{}
	}
}

// pick chooses the class whose oldest waiter gets the next slot:
// critical if it waits; otherwise the highest class waiting, unless a
// class passed over has earned a turn. Must hold q.mu with at least one
// waiter.
func (q *Queue) pick() int {
	ci := schemas.PriorityCritical.Index()
	if q.classes[ci].n > 0 {
		return ci
	}
	top := -1
	for i := ci - 1; i >= 0; i-- {
		if q.classes[i].n > 0 {
			top = i
			break
		}
	}
	chosen := top
	for i := top - 1; i >= 0; i-- {
		if q.classes[i].n > 0 && q.credit[i] >= turn {
			chosen = i
			break
		}
	}
	if chosen != top {
		q.credit[chosen] -= turn
	}
	for i := range top {
		if i != chosen && q.classes[i].n > 0 {
			q.credit[i] += q.shares[i]
		}
	}
	return chosen
}

// poll retries the waiting requests against a remote Gate and re-arms
// itself while any wait.
func (q *Queue) poll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dispatch()
	if q.nwait.Load() > 0 {
		q.clock.AfterFunc(q.pollEvery, q.poll)
		return
	}
	q.polling = false
}

// expire refuses w at its deadline if it still waits.
func (q *Queue) expire(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.state == waiting {
		q.refuse(w, Expired, q.clock.Now())
	}
}

// refuse takes a waiting w out of the queue with reason r and wakes it.
// Must hold q.mu.
func (q *Queue) refuse(w *waiter, r Reason, now time.Time) {
	q.remove(w)
	ci := w.class.Index()
	w.state, w.reason, w.waited = refused, r, now.Sub(w.enq)
	if r != Canceled {
		q.refused[ci].Add(1)
		est, _ := q.estimate(ci)
		w.retryAfter = max(time.Second, est)
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	w.ready <- struct{}{}
	// Hand out any slot that is free while others wait: a Gate may gain
	// capacity without a Release (a limit raised, slots counted
	// elsewhere), and every change of the queue is a chance to settle it.
	q.dispatch()
}

func (q *Queue) push(w *waiter) {
	f := &q.classes[w.class.Index()]
	w.prev = f.tail
	if f.tail != nil {
		f.tail.next = w
	} else {
		f.head = w
	}
	f.tail = w
	f.n++
	q.nwait.Add(1)
}

func (q *Queue) remove(w *waiter) {
	ci := w.class.Index()
	f := &q.classes[ci]
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		f.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		f.tail = w.prev
	}
	w.prev, w.next = nil, nil
	f.n--
	if f.n == 0 {
		q.credit[ci] = 0 // no saving up while idle
	}
	q.nwait.Add(-1)
}

// QueueStats is a snapshot of a Queue for metrics and the live view.
type QueueStats struct {
	// Waiting, Admitted and Refused are per class, indexed by
	// Class.Index. Refused counts every refusal but cancellations.
	Waiting  [schemas.NumPriorities]int
	Admitted [schemas.NumPriorities]uint64
	Refused  [schemas.NumPriorities]uint64
	// Limit is the Gate's current limit; HoldMean the mean time a slot is
	// held; ServiceRate the slots freed per second they imply.
	Limit       int
	HoldMean    time.Duration
	ServiceRate float64
}

// Stats returns a snapshot.
func (q *Queue) Stats() QueueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	var s QueueStats
	for i := range schemas.NumPriorities {
		s.Waiting[i] = q.classes[i].n
		s.Admitted[i] = q.admitted[i].Load()
		s.Refused[i] = q.refused[i].Load()
	}
	s.Limit = q.gate.Limit()
	s.HoldMean = time.Duration(q.holdNS.Load())
	s.ServiceRate = q.serviceRate()
	return s
}

// Waiting is the number of requests waiting.
func (q *Queue) Waiting() int { return int(q.nwait.Load()) }

// MaxWaitingRequests is the queue's bound.
func (q *Queue) MaxWaitingRequests() int { return q.maxWaiting }

type waitState uint8

const (
	waiting waitState = iota
	granted
	refused
)

// waiter is a request in the queue. Its fields other than ready are
// guarded by Queue.mu until ready is signalled; then they are final.
type waiter struct {
	class      schemas.Priority
	enq, at    time.Time
	state      waitState
	reason     Reason
	waited     time.Duration
	retryAfter time.Duration
	timer      interface{ Stop() bool }
	prev, next *waiter
	ready      chan struct{}
}

// fifo is one class's waiters, oldest at head.
type fifo struct {
	head, tail *waiter
	n          int
}

package admission

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// instance is the local side of one rule instance (one Redis key): its
// lease, the rate it is admitted at, what Redis last said about it, and the
// local limiter that stands in while Redis is unreachable.
type instance struct {
	r     *rule
	key   string
	slot  uint16
	scope Scope

	// leaseLeft is spent without a lock by tryLease; leaseExp (l.now()
	// clock) ends it.
	leaseLeft atomic.Int64
	leaseExp  atomic.Int64
	// leaseAtMs is Redis's clock when the current lease was debited.
	leaseAtMs atomic.Int64
	// Below lowWater a lease hit asks for a renewal in the background.
	lowWater atomic.Int64
	renewing atomic.Bool
	units    atomic.Int64 // units admitted through Redis since the last rate sample
	// remaining and resetAt are Redis's word at the last reply (-1:
	// unknown), for headers.
	remaining atomic.Int64
	resetAt   atomic.Int64
	// A fresh refusal: requests needing blockNeed or more, with at least
	// blockFloor to leave, are refused until blockUntil.
	blockUntil atomic.Int64
	blockNeed  atomic.Int64
	blockFloor atomic.Int64 // the refused request's reserve floor
	blockNever atomic.Bool
	// What Redis said with that refusal: when the refused request fits
	// (its clock, as an offset of ours) and the units available, which a
	// cached refusal repeats rather than the cache entry's own end.
	blockRetryAt atomic.Int64
	blockAvail   atomic.Int64
	lastUsed     atomic.Int64

	mu     sync.Mutex
	rate   float64 // units per second, smoothed
	rateAt int64
	// Units put into and taken out of the lease, and what had been spent
	// from it at the last rate sample: issued - drained - leaseLeft is what
	// lease hits spent, counted without touching the hot path.
	issued, drained, spentMark int64
	leaseGran                  int64 // window granule the current lease was debited in
	inLeased                   bool  // in Limiter.leased
	dead                       bool  // retired: anything it would keep goes to Redis instead
	transient                  bool
	refs                       int // match sets holding it; guarded by generation.imu
	loc                        localState
	pending                    int64 // units debited locally that Redis has not seen
	inPending                  bool
}

func newInstance(r *rule, key string, scope Scope, now int64) *instance {
	in := &instance{r: r, key: key, slot: keySlot(key), scope: scope, rateAt: now}
	in.remaining.Store(-1)
	in.lastUsed.Store(now)
	return in
}

// touchEvery is how stale lastUsed may get: a store on every admission
// would bounce its cache line between cores for an idle check that runs
// once in IdleTTL/4.
const touchEvery = int64(time.Second)

func (in *instance) touch(now int64) {
	if now-in.lastUsed.Load() > touchEvery {
		in.lastUsed.Store(now)
	}
}

// tryLease spends n units of the lease, if it holds them and has not
// expired, and returns what is left.
func (in *instance) tryLease(n, now int64) (bool, int64) {
	if in.leaseExp.Load() < now {
		return false, 0
	}
	for {
		left := in.leaseLeft.Load()
		if left < n {
			return false, left
		}
		if in.leaseLeft.CompareAndSwap(left, left-n) {
			return true, left - n
		}
	}
}

// giveBack returns n units taken by tryLease (a refusal elsewhere, or a
// settled over-estimate): to the lease while it lives, up to maxLease so
// that what a gateway holds stays within the stated bound; the rest (and
// all of it once the lease is gone) to Redis.
func (in *instance) giveBack(l *Limiter, n int64) {
	in.mu.Lock()
	if !in.dead && in.inLeased {
		add := min(n, max(in.r.maxLease-in.leaseLeft.Load(), 0))
		in.leaseLeft.Add(add)
		in.issued += add
		n -= add
	}
	gran := in.leaseGran
	in.mu.Unlock()
	if n > 0 {
		l.pend.add(l, in, -n, gran)
	}
}

// refundLeased returns a settled over-estimate of n units that a ticket
// spent from the lease debited at leaseMs. A window's units go back to that
// lease while it lives (up to maxLease) and otherwise to its granule in
// Redis: never to a later granule, which would let the window forget usage
// before it really leaves. A bucket's go to whatever lease is live.
func (in *instance) refundLeased(l *Limiter, n, leaseMs int64) {
	if in.r.gran == 0 {
		in.giveBack(l, n)
		return
	}
	in.mu.Lock()
	if !in.dead && in.inLeased && in.leaseAtMs.Load() == leaseMs {
		add := min(n, max(in.r.maxLease-in.leaseLeft.Load(), 0))
		in.leaseLeft.Add(add)
		in.issued += add
		n -= add
	}
	in.mu.Unlock()
	if n > 0 {
		l.pend.add(l, in, -n, leaseMs/in.r.gran)
	}
}

// leaseWant returns the lease to ask for with a request of n units: about
// leaseHorizon of the observed rate, capped by the rule's maxLease, and 0
// when the instance is not busy enough for a lease to pay. A lease must
// hold two requests (and minLease units) to pay; an instance too slow to
// fill that in leaseHorizon gets it if it fills it within the lease's
// life: 100 ms of 3 to 12 requests a second is less than two requests,
// and those instances would otherwise always run exact.
func (in *instance) leaseWant(l *Limiter, n, now int64) int64 {
	if in.r.maxLease == 0 || in.transient || l.closed.Load() {
		return 0
	}
	in.mu.Lock()
	if el := now - in.rateAt; el >= int64(10*time.Millisecond) {
		spent := in.issued - in.drained - in.leaseLeft.Load()
		inst := float64(spent-in.spentMark+in.units.Swap(0)) / (float64(el) / 1e9)
		in.spentMark = spent
		if in.rate == 0 {
			in.rate = inst
		} else {
			in.rate = 0.5*in.rate + 0.5*inst
		}
		in.rateAt = now
	}
	rate := in.rate
	in.mu.Unlock()
	least := max(2*n, minLease)
	w := int64(rate * l.o.leaseHorizon.Seconds())
	if w < least && rate*float64(in.leaseTTL(l))/1e9 >= float64(least) {
		w = least
	}
	// What the gateway holds stays within maxLease: that is the bound.
	w = min(w, in.r.maxLease-in.leaseLeft.Load())
	if w < least {
		return 0
	}
	return w
}

// leaseTTL is how long a lease of this rule may be spent.
func (in *instance) leaseTTL(l *Limiter) int64 {
	ttl := l.o.leaseTTL
	if in.r.Algorithm == SlidingWindow {
		ttl = min(ttl, in.r.Window/4)
	}
	return int64(ttl)
}

// addLease adds a grant Redis debited at nowMs (its clock) to the lease.
func (in *instance) addLease(l *Limiter, grant, nowMs, now int64) {
	gran := int64(-1)
	if in.r.gran > 0 {
		gran = nowMs / in.r.gran
	}
	l.m.leases.WithLabelValues("taken").Inc()
	l.m.leaseUnits.WithLabelValues("taken").Add(float64(grant))
	in.mu.Lock()
	if in.dead {
		in.mu.Unlock()
		l.returnLease(in, grant, gran)
		return
	}
	var old int64
	if in.r.gran > 0 && in.leaseGran != gran {
		// A window's lease rest goes back to the granule it was debited in.
		old = in.leaseLeft.Swap(grant)
		in.drained += old
	} else {
		in.leaseLeft.Add(grant)
	}
	in.issued += grant
	oldGran := in.leaseGran
	in.leaseGran = gran
	in.leaseAtMs.Store(nowMs)
	in.lowWater.Store(in.leaseLeft.Load() / 2)
	in.leaseExp.Store(now + in.leaseTTL(l))
	register := !in.inLeased
	in.inLeased = true
	in.mu.Unlock()
	if old > 0 {
		l.returnLease(in, old, oldGran)
	}
	if register {
		l.leasedMu.Lock()
		l.leased[in] = struct{}{}
		l.leasedMu.Unlock()
	}
}

func (l *Limiter) returnLease(in *instance, units, gran int64) {
	if units <= 0 {
		return
	}
	l.m.leases.WithLabelValues("returned").Inc()
	l.m.leaseUnits.WithLabelValues("returned").Add(float64(units))
	l.pend.add(l, in, -units, gran)
}

// expireLease returns the lease's rest when it has expired (or force).
func (in *instance) expireLease(l *Limiter, now int64, force bool) (stillLeased bool) {
	in.mu.Lock()
	if !force && in.leaseExp.Load() >= now {
		in.mu.Unlock()
		return true
	}
	left := in.leaseLeft.Swap(0)
	in.drained += left
	gran := in.leaseGran
	in.inLeased = false
	in.mu.Unlock()
	l.returnLease(in, left, gran)
	return false
}

// headroom is what the instance has left as far as this gateway knows:
// Redis's remaining at the last reply plus the local lease.
func (in *instance) headroom(now int64) Headroom {
	h := Headroom{Limit: in.r.Limit, Remaining: in.r.Limit}
	if rem := in.remaining.Load(); rem >= 0 {
		h.Remaining = min(rem+in.leaseLeft.Load(), in.r.Limit)
	}
	if at := in.resetAt.Load(); at > now {
		h.Reset = time.Duration(at - now)
	}
	return h
}

// noteReply records Redis's word on the instance after an admission.
func (in *instance) noteReply(remaining, resetMs, now int64) {
	in.remaining.Store(remaining)
	in.resetAt.Store(now + resetMs*int64(time.Millisecond))
}

// localState is the in-memory limiter of the fail-open mode: the rule with
// its limit (and rate) divided by the gateway count.
type localState struct {
	valid bool
	// word is the resetAt of the Redis reply the state was built from. The
	// state lasts until Redis gives a newer word on the instance, which it
	// only does once it takes scripts again: not when a probe finds it
	// answering PING, nor when a flush is tried (and fails).
	word   int64
	tokens float64
	last   int64
	win    [Granules + 2]struct{ g, n int64 }
}

func (in *instance) localLimits(l *Limiter) (limit int64, perNs float64) {
	g := int64(l.o.gateways)
	limit = (in.r.Limit + g - 1) / g
	perNs = in.r.Rate / float64(g) / 1e9
	return limit, perNs
}

// localTake debits n units from the local limiter, all or nothing, and
// records them for reconciliation.
func (in *instance) localTake(l *Limiter, n, now int64) (ok bool, avail int64, retry time.Duration) {
	limit, perNs := in.localLimits(l)
	in.mu.Lock()
	defer in.mu.Unlock()
	s := &in.loc
	if word := in.resetAt.Load(); !s.valid || s.word != word {
		// Start from Redis's last word, shared out, so an outage does not
		// hand out a fresh limit on top of what is already spent.
		s.valid, s.word, s.last, s.tokens = true, word, now, float64(limit)
		s.win = [Granules + 2]struct{ g, n int64 }{}
		if rem := in.remaining.Load(); rem >= 0 {
			s.tokens = float64((rem + int64(l.o.gateways) - 1) / int64(l.o.gateways))
			if in.r.Algorithm == SlidingWindow {
				in.winAdd(now, max(limit-int64(s.tokens), 0))
			}
		}
	}
	switch in.r.Algorithm {
	case TokenBucket:
		s.tokens = math.Min(float64(limit), s.tokens+float64(now-s.last)*perNs)
		s.last = now
		if float64(n) > s.tokens {
			avail = int64(math.Max(s.tokens, 0))
			if n <= limit {
				retry = time.Duration(math.Ceil((float64(n) - s.tokens) / perNs))
			}
			return false, avail, retry
		}
		s.tokens -= float64(n)
	case CalendarPeriod:
		// The limit's share for this gateway, as of Redis's last word;
		// it does not start again at a period's end before Redis is back
		// (refusing more, never admitting more).
		if float64(n) > s.tokens {
			avail = int64(math.Max(s.tokens, 0))
			if n <= limit {
				now := l.o.clock()
				_, end := in.r.Calendar.Bounds(now)
				retry = end.Sub(now)
			}
			return false, avail, retry
		}
		s.tokens -= float64(n)
	case SlidingWindow:
		used, oldestExit := in.winUsed(now)
		if used+n > limit {
			return false, max(limit-used, 0), oldestExit
		}
		in.winAdd(now, n)
	}
	in.addPendingLocked(l, n)
	return true, 0, 0
}

// localUndo reverses a localTake of a request another rule refused.
func (in *instance) localUndo(l *Limiter, n, now int64) {
	in.localAdjust(l, -n, now)
}

// localAdjust applies a settlement correction to the local limiter and
// records it for reconciliation.
func (in *instance) localAdjust(l *Limiter, delta, now int64) {
	limit, _ := in.localLimits(l)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.loc.valid {
		switch in.r.Algorithm {
		case TokenBucket, CalendarPeriod:
			in.loc.tokens = math.Min(float64(limit), in.loc.tokens-float64(delta))
		case SlidingWindow:
			in.winAdd(now, delta)
		}
	}
	in.addPendingLocked(l, delta)
}

func (in *instance) addPendingLocked(l *Limiter, delta int64) {
	if in.dead {
		// Nobody will flush a retired instance: queue the debit directly.
		l.pend.add(l, in, delta, -1)
		return
	}
	in.pending += delta
	if !in.inPending {
		in.inPending = true
		l.pend.addInstance(in)
	}
}

func (in *instance) winGran(now int64) int64 { return now / (in.r.gran * int64(time.Millisecond)) }

func (in *instance) winAdd(now, n int64) {
	g := in.winGran(now)
	s := &in.loc.win[g%int64(len(in.loc.win))]
	if s.g != g {
		s.g, s.n = g, 0
	}
	s.n = max(s.n+n, 0)
}

// winUsed sums the local window and says when its oldest granule leaves.
func (in *instance) winUsed(now int64) (used int64, oldestExit time.Duration) {
	granNs := in.r.gran * int64(time.Millisecond)
	oldest := (now - int64(in.r.Window)) / granNs
	first := int64(-1)
	for _, s := range in.loc.win {
		if s.n > 0 && s.g >= oldest {
			used += s.n
			if first < 0 || s.g < first {
				first = s.g
			}
		}
	}
	if first >= 0 {
		oldestExit = time.Duration(max((first+1)*granNs+int64(in.r.Window)-now, 0))
	}
	return used, oldestExit
}

// takePending hands the local debits to reconciliation. The local limiter
// stays as it is: whether the flush succeeds or not, it is what this
// gateway knows until Redis answers an admission of the instance again
// (localState.word); forgetting it at every flush let a Redis that answers
// PING but refuses scripts hand out a fresh share every probe interval.
func (in *instance) takePending() int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	p := in.pending
	in.pending, in.inPending = 0, false
	return p
}

// retire marks the instance dead and sends what it holds to Redis.
func (in *instance) retire(l *Limiter) {
	in.mu.Lock()
	in.dead = true
	left := in.leaseLeft.Swap(0)
	in.drained += left
	gran := in.leaseGran
	in.inLeased = false
	p := in.pending
	in.pending = 0
	in.mu.Unlock()
	l.returnLease(in, left, gran)
	if p != 0 {
		l.pend.add(l, in, p, -1)
	}
}

package admission

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"
)

// Ticket is the outcome of one Admit: the Decision, and what Settle needs
// to correct the estimate once the call is over. Keep the Ticket Admit
// returned and settle that variable: Settle records on it that it ran, so
// calling it again (a retry, a deferred cleanup after an explicit settle)
// applies nothing twice. Corrections that went to Redis are also keyed
// there by an id of this admission (WithSettleTTL), so a copy of the
// ticket settled a second time does not apply them twice either.
type Ticket struct {
	Decision Decision

	l   *Limiter
	set *matchSet
	id  string // Request.ID, for logs
	// seq numbers an admission Redis decided at its Limiter: with the
	// Limiter's nonce, the id of its settlement's markers (settleID).
	seq  uint64
	est  amounts // what Admit debited, per unit
	atMs int64   // Redis clock of the debit
	// atMsBy, when set, is each instance's Redis clock of its debit
	// (several slot groups on a Cluster: several clocks).
	atMsBy []int64
	// leaseMs is the Redis clock of the oldest lease spent (leases of
	// several instances, maybe of several masters): a refund to its
	// granule is never later than the one the lease was debited in, so
	// the window may count the units a little longer, never forget them
	// early.
	leaseMs       int64
	leased, local uint64 // instances debited from a lease / the local limiter
	// periods is, by set position, the period each calendar period rule
	// debited (nil without such rules): its refunds go there.
	periods []int64
	// refusedBy is the instance that refused, for Acquire.
	refusedBy *instance
	state     uint32 // ticketOpen ... ticketRemoteLeft
}

// The states of a Ticket.
const (
	ticketOpen uint32 = iota
	ticketSettling
	ticketSettled
	// ticketRemoteLeft: the in-memory corrections (leases, the local
	// limiter) were applied, the Redis ones neither applied nor queued
	// (ErrBacklogFull); a retry sends only those.
	ticketRemoteLeft
)

// Allowed reports whether the request may go upstream.
func (t *Ticket) Allowed() bool { return t.Decision.Allowed }

// Settle charges or refunds the difference between the estimate Admit
// debited and what the call really spent, on every rule the admission
// debited: call it once the call is over (on success, on error, when a
// streaming call ends or is cancelled). It applies once: later calls on the
// same ticket return nil and do nothing. Settling a refused ticket does
// nothing.
//
// Corrections of leased rules are applied to the lease in memory; the
// others go to Redis within WithMaxWait. If Redis does not answer in time
// the corrections are queued and applied, once, when it is back; Settle
// then returns nil, unless the queue is full (ErrBacklogFull). Then the
// Redis corrections are not applied: the Limiter counts the failure
// (sluice_admission_settlements_total{result="failed"}) and logs it (at
// most every few seconds), so a caller with nowhere to report the error
// may ignore it; one that can wait may call Settle again, with the same
// usage, which sends only the Redis corrections (the in-memory ones
// were applied the first time) and applies none of them twice.
func (t *Ticket) Settle(ctx context.Context, u Usage) error {
	if !t.Decision.Allowed || t.l == nil || t.set == nil {
		return nil
	}
	u.PromptTokens, u.CompletionTokens, u.Cost = max(u.PromptTokens, 0), max(u.CompletionTokens, 0), max(u.Cost, 0)
	inMemory := true
	if !atomic.CompareAndSwapUint32(&t.state, ticketOpen, ticketSettling) {
		if !atomic.CompareAndSwapUint32(&t.state, ticketRemoteLeft, ticketSettling) {
			return nil // settled, or being settled by another goroutine
		}
		inMemory = false
	}
	l := t.l
	remote := t.corrections(u, inMemory)
	if len(remote) > 0 {
		if err := l.settleRemote(ctx, t.settleID(), remote); err != nil {
			atomic.StoreUint32(&t.state, ticketRemoteLeft)
			l.settleFailed(t.id, err)
			return err
		}
	}
	atomic.StoreUint32(&t.state, ticketSettled)
	return nil
}

// corrections returns the ticket's Redis corrections for usage u, having
// applied the in-memory ones (leases, the local limiter) when inMemory.
func (t *Ticket) corrections(u Usage, inMemory bool) []adjustment {
	l := t.l
	now := l.now()
	var remote []adjustment
	for i, in := range t.set.insts {
		d := u.actual(in.r.Unit) - need(in.r.Unit, t.est)
		if d == 0 {
			continue
		}
		bit := uint64(1) << uint(i)
		switch {
		case t.leased&bit != 0:
			if !inMemory {
				continue
			}
			if d < 0 {
				in.refundLeased(l, -d, t.leaseMs)
			} else if ok, _ := in.tryLease(d, now); !ok {
				l.pend.add(l, in, d, -1)
			}
		case t.local&bit != 0:
			if inMemory {
				in.localAdjust(l, d, now)
			}
		default:
			at := int64(-1)
			switch {
			case in.r.gran > 0:
				ms := t.atMs
				if t.atMsBy != nil {
					ms = t.atMsBy[i]
				}
				at = ms / in.r.gran
			case in.r.period != nil && t.periods != nil:
				at = t.periods[i]
			}
			remote = append(remote, adjustment{in: in, at: at, delta: d})
		}
	}
	return remote
}

// settleID is the id of the ticket's settlement markers: made by the
// Limiter for this admission, never the client's request id, which other
// tenants, other gateways and the same tenant again may use too (and then
// a settlement would be skipped as a duplicate of another's).
func (t *Ticket) settleID() string {
	if t.seq == 0 {
		// Only an admission Redis decided has Redis corrections, and
		// admitSlow numbers those; this is a safety net.
		t.seq = t.l.seq.Add(1)
	}
	return t.l.nonce + "." + strconv.FormatUint(t.seq, 36)
}

// settleRemote applies a ticket's Redis corrections, one marked call per
// slot group (<first instance key>:settled:<id>), within WithMaxWait; the
// calls Redis did not answer are queued as they are, so whether or not
// they had been applied, they are applied once.
func (l *Limiter) settleRemote(ctx context.Context, id string, remote []adjustment) error {
	calls := l.seal(remote, func(first string, _ int) string { return first + ":settled:" + id })
	for i := range calls {
		calls[i].settle = true
	}
	if !l.down.Load() {
		wctx, cancel := context.WithTimeout(ctx, l.o.maxWait)
		failed, err := l.applyMarked(wctx, calls)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() == nil {
			l.markDown(err)
		}
		calls = failed
	}
	if !l.pend.queue(l, calls) {
		return ErrBacklogFull
	}
	l.m.settles.WithLabelValues("deferred").Inc()
	return nil
}

// settleLogEvery spaces the logs of failed settlements: in an outage long
// enough to fill the backlog every settlement fails.
const settleLogEvery = 10 * time.Second

// settleFailed counts a settlement whose Redis corrections could neither
// be applied nor queued, and logs it (at most once per settleLogEvery,
// with the number since the last log): callers on the request path
// usually have nowhere to report Settle's error, and a lost correction
// must not go unnoticed.
func (l *Limiter) settleFailed(id string, err error) {
	l.m.settles.WithLabelValues("failed").Inc()
	n := l.settleFails.Add(1)
	now := l.now()
	last := l.settleLogAt.Load()
	if last != 0 && now-last < int64(settleLogEvery) || !l.settleLogAt.CompareAndSwap(last, now) {
		return
	}
	l.o.log.Error("admission: settlements failed: their corrections of the estimates are not in Redis; "+
		"they apply if the same tickets are settled again, else raise WithMaxPending (or find why Redis is away)",
		"failed", n-l.settleLogged.Swap(n), "request_id", id, "err", err)
}

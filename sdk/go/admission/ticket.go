package admission

import (
	"context"
	"sync/atomic"
)

// Ticket is the outcome of one Admit: the Decision, and what Settle needs
// to correct the estimate once the call is over. Keep the Ticket Admit
// returned and settle that variable: Settle records on it that it ran, so
// calling it again (a retry, a deferred cleanup after an explicit settle)
// applies nothing twice. Corrections that went to Redis are also keyed by
// the request id there (WithSettleTTL), so a copy of the ticket settled a
// second time does not apply them twice either.
type Ticket struct {
	Decision Decision

	l                  *Limiter
	set                *matchSet
	id                 string
	prompt, completion int64
	atMs               int64  // Redis clock of the debit
	leaseMs            int64  // Redis clock of the oldest lease spent
	leased, local      uint64 // instances debited from a lease / the local limiter
	state              uint32 // 0 open, 1 settling, 2 settled
}

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
// then returns nil, unless the queue is full (ErrBacklogFull), in which
// case the ticket stays unsettled.
func (t *Ticket) Settle(ctx context.Context, u Usage) error {
	if !t.Decision.Allowed || t.l == nil || t.set == nil {
		return nil
	}
	if u.PromptTokens < 0 || u.CompletionTokens < 0 {
		u.PromptTokens, u.CompletionTokens = max(u.PromptTokens, 0), max(u.CompletionTokens, 0)
	}
	if !atomic.CompareAndSwapUint32(&t.state, 0, 1) {
		return nil
	}
	l := t.l
	now := l.now()
	var remote []adjustment
	for i, in := range t.set.insts {
		d := u.actual(in.r.Unit) - need(in.r.Unit, t.prompt, t.completion)
		if d == 0 {
			continue
		}
		bit := uint64(1) << uint(i)
		switch {
		case t.leased&bit != 0:
			if d < 0 {
				in.refundLeased(l, -d, t.leaseMs)
			} else if ok, _ := in.tryLease(d, now); !ok {
				l.pend.add(l, in, d, -1)
			}
		case t.local&bit != 0:
			in.localAdjust(l, d, now)
		default:
			at := int64(-1)
			if in.r.gran > 0 {
				at = t.atMs / in.r.gran
			}
			remote = append(remote, adjustment{in: in, at: at, delta: d})
		}
	}
	if len(remote) > 0 {
		if t.id == "" {
			t.id = l.newID()
		}
		if err := l.settleRemote(ctx, t.id, remote); err != nil {
			atomic.StoreUint32(&t.state, 0)
			return err
		}
	}
	atomic.StoreUint32(&t.state, 2)
	return nil
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

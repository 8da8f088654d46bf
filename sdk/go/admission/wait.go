package admission

import (
	"context"
	"slices"
	"sync"
	"time"
)

// This file is Acquire: a request a rule refuses may wait, when the rule
// lets its class wait (Rule.Wait), for the rule to admit it. Waiters do
// not poll. They queue on the refusing rule instance, and one timer per
// instance fires when Redis said the instance would fit the first of them
// (the refusal's retry-after); that wake-up retries the waiters in
// priority order, one Admit each, until one is refused again, whose
// retry-after sets the next wake-up. So an instance with a thousand
// waiters costs one Redis call per wake-up plus one per admission, never
// one per waiter per tick.

// waitQueue is the Limiter's waiting requests, by the instance key that
// refused them. n is bounded by WithMaxWaiters.
type waitQueue struct {
	mu     sync.Mutex
	n      int
	seq    uint64
	closed bool
	keys   map[string]*waitKey
}

// waitKey is the waiters of one rule instance, most important first then
// in arrival order, and its wake-up.
type waitKey struct {
	key   string
	ws    []*waiter
	timer *time.Timer
	at    time.Time // when timer fires
	busy  bool      // a wake-up is retrying the waiters
}

// waiter is one request held by Acquire. out receives its outcome once.
type waiter struct {
	ctx      context.Context
	req      Request
	rank     int
	seq      uint64
	start    time.Time
	deadline time.Time
	last     Ticket // the latest refusal, answered when it stops waiting
	key      string // the instance it waits for; guarded by waitQueue.mu
	out      chan Ticket
}

func (w *waiter) before(o *waiter) bool {
	if w.rank != o.rank {
		return w.rank > o.rank
	}
	return w.seq < o.seq
}

// Acquire is Admit for a request that may wait: when a rule refuses it
// and that rule lets the request's class wait (Rule.Wait), Acquire holds
// it until the rule admits it, in priority order with the other waiters
// of that rule instance, or until its deadline — the earliest of the
// rule's wait for the class, req.Deadline and ctx's deadline; a request
// that another rule refuses when it is retried waits for that one, within
// the same deadline — and then
// returns the admission or the refusal (the usual 429). A request whose
// deadline comes before the refusal's retry-after is refused at once, as
// is one that finds WithMaxWaiters requests waiting. Without a rule that
// lets it wait, Acquire is Admit.
func (l *Limiter) Acquire(ctx context.Context, req Request) (Ticket, error) {
	t, err := l.Admit(ctx, req)
	if err != nil || t.Allowed() {
		return t, err
	}
	now := time.Now()
	deadline, ok := waitDeadline(ctx, &req, &t, now)
	if !ok {
		return t, nil
	}
	class := req.Priority.OrDefault()
	if now.Add(t.Decision.RetryAfter).After(deadline) {
		l.m.waitSkipped.WithLabelValues("deadline").Inc()
		return t, nil
	}
	w := &waiter{ctx: ctx, req: req, rank: class.Rank(), start: now, deadline: deadline, last: t, out: make(chan Ticket, 1)}
	if !l.enqueue(w, t.refusedBy.key, now.Add(t.Decision.RetryAfter), true) {
		l.m.waitSkipped.WithLabelValues("full").Inc()
		return t, nil
	}
	select {
	case got := <-w.out:
		return got, nil
	case <-ctx.Done():
		// Unless a wake-up holds it now (its outcome comes then), the
		// caller gone ends the wait with the last refusal.
		if l.dequeue(w) {
			l.answer(w, w.last)
		}
		return <-w.out, nil
	}
}

// waitDeadline returns until when req may wait for the rule that refused
// t, and false when it may not wait at all: the refusal is not one a wait
// can end (Redis unreachable, a request larger than the limit, no known
// retry-after), or the rule gives the class no wait.
func waitDeadline(ctx context.Context, req *Request, t *Ticket, now time.Time) (time.Time, bool) {
	d, in := &t.Decision, t.refusedBy
	if in == nil || d.Never || d.RetryAfter <= 0 || (d.Path != PathRedis && d.Path != PathCached) {
		return time.Time{}, false
	}
	most := in.r.Wait[req.Priority.OrDefault().Index()]
	if most <= 0 {
		return time.Time{}, false
	}
	deadline := now.Add(most)
	if !req.Deadline.IsZero() && req.Deadline.Before(deadline) {
		deadline = req.Deadline
	}
	if cd, ok := ctx.Deadline(); ok && cd.Before(deadline) {
		deadline = cd
	}
	return deadline, true
}

// enqueue adds w to the waiters of key, to be retried at wake; fresh is
// false for a waiter moving from another key (already counted). It
// reports false when the queue is full or closed.
func (l *Limiter) enqueue(w *waiter, key string, wake time.Time, fresh bool) bool {
	q := &l.wq
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.n >= l.o.maxWaiters {
		return false
	}
	q.n++
	q.seq++
	if fresh {
		w.seq = q.seq
	}
	l.m.waiters.Inc()
	k := q.keys[key]
	if k == nil {
		k = &waitKey{key: key}
		q.keys[key] = k
	}
	w.key = key
	k.insert(w)
	if !k.busy {
		l.schedule(k, wake)
	}
	return true
}

func (k *waitKey) insert(w *waiter) {
	i, _ := slices.BinarySearchFunc(k.ws, w, func(a, b *waiter) int {
		if a.before(b) {
			return -1
		}
		return 1
	})
	k.ws = slices.Insert(k.ws, i, w)
}

// schedule makes k's wake-up fire at wake, unless it fires sooner already.
// Called with q.mu held.
func (l *Limiter) schedule(k *waitKey, wake time.Time) {
	if k.timer != nil {
		if !k.at.After(wake) {
			return
		}
		k.timer.Stop()
	}
	k.at = wake
	k.timer = time.AfterFunc(time.Until(wake), func() { l.wakeUp(k) })
}

// dequeue takes w off its key's waiters; false if a wake-up already took
// it.
func (l *Limiter) dequeue(w *waiter) bool {
	q := &l.wq
	q.mu.Lock()
	defer q.mu.Unlock()
	k := q.keys[w.key]
	if k == nil {
		return false
	}
	i := slices.Index(k.ws, w)
	if i < 0 {
		return false
	}
	k.ws = slices.Delete(k.ws, i, i+1)
	q.n--
	l.m.waiters.Dec()
	return true
}

// answer answers w with t, once, and counts its wait.
func (l *Limiter) answer(w *waiter, t Ticket) {
	result := "refused"
	if t.Allowed() {
		result = "admitted"
	}
	l.m.waitSeconds.WithLabelValues(string(w.req.Priority.OrDefault()), result).Observe(time.Since(w.start).Seconds())
	w.out <- t
}

// wakeUp retries k's waiters in order until one is refused by k again:
// that refusal's retry-after schedules the next wake-up, and the waiters
// whose deadline comes before it are refused now.
func (l *Limiter) wakeUp(k *waitKey) {
	q := &l.wq
	q.mu.Lock()
	if q.keys[k.key] != k || k.busy { // a timer Stop came too late for
		q.mu.Unlock()
		return
	}
	k.timer, k.busy = nil, true
	q.mu.Unlock()
	for {
		q.mu.Lock()
		if len(k.ws) == 0 || q.closed {
			k.busy = false
			if len(k.ws) == 0 {
				delete(q.keys, k.key)
			}
			q.mu.Unlock()
			return
		}
		w := k.ws[0]
		k.ws = k.ws[1:]
		q.n--
		l.m.waiters.Dec()
		q.mu.Unlock()
		now := time.Now()
		if !now.Before(w.deadline) || w.ctx.Err() != nil {
			l.answer(w, w.last)
			continue
		}
		t, err := l.Admit(w.ctx, w.req)
		if err != nil || t.Allowed() {
			if err != nil {
				t = w.last
			}
			l.answer(w, t)
			continue
		}
		w.last = t
		if _, ok := waitDeadline(w.ctx, &w.req, &t, now); !ok || now.Add(t.Decision.RetryAfter).After(w.deadline) {
			l.answer(w, t)
			continue
		}
		if t.refusedBy.key != k.key {
			// Another rule refuses it now: it waits for that one.
			if !l.enqueue(w, t.refusedBy.key, now.Add(t.Decision.RetryAfter), false) {
				l.answer(w, t)
			}
			continue
		}
		l.requeue(k, w, now.Add(t.Decision.RetryAfter))
		return
	}
}

// requeue puts w back at its place among k's waiters, schedules k's next
// wake-up at wake and refuses now the waiters whose deadline is before it.
func (l *Limiter) requeue(k *waitKey, w *waiter, wake time.Time) {
	q := &l.wq
	q.mu.Lock()
	k.insert(w)
	var late []*waiter
	keep := k.ws[:0]
	for _, x := range k.ws {
		if x.deadline.Before(wake) {
			late = append(late, x)
		} else {
			keep = append(keep, x)
		}
	}
	clear(k.ws[len(keep):])
	k.ws = keep
	q.n -= len(late) - 1 // w was taken off the count when it was retried
	l.m.waiters.Add(float64(1 - len(late)))
	k.busy = false
	if len(k.ws) > 0 {
		l.schedule(k, wake)
	} else {
		delete(q.keys, k.key)
	}
	q.mu.Unlock()
	for _, x := range late {
		l.answer(x, x.last)
	}
}

// refuseWaiters answers every waiter with its last refusal (Close).
func (l *Limiter) refuseWaiters() {
	q := &l.wq
	q.mu.Lock()
	q.closed = true
	var all []*waiter
	for key, k := range q.keys {
		if k.timer != nil {
			k.timer.Stop()
		}
		all = append(all, k.ws...)
		q.n -= len(k.ws)
		l.m.waiters.Sub(float64(len(k.ws)))
		k.ws = nil
		delete(q.keys, key)
	}
	q.mu.Unlock()
	for _, w := range all {
		l.answer(w, w.last)
	}
}

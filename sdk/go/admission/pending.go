package admission

import (
	"context"
	"sync"
)

// pending holds the corrections Redis has not taken yet: lease rests,
// refunds that could not be sent, settlements made while Redis was
// unreachable, and (through the instances listed in insts) the local
// limiter's debits. It is bounded by WithMaxPending; see there.
//
// Corrections wait open (adj, insts: merged per instance and granule)
// until a flush seals them into marked calls; a sealed call is sent again
// exactly as it is, marker included, until Redis answers it, so a call
// Redis applied but whose reply was lost (a timeout, one master of a
// Cluster failing) is not applied twice. Settlements are sealed from the
// start, with their ticket's marker.
type pending struct {
	mu    sync.Mutex
	max   int
	adj   map[adjKey]*adjustment
	insts map[*instance]struct{}
	calls []markedCall
}

type adjKey struct {
	key string
	at  int64
}

// adjustment is one signed correction of one instance; at is the window
// granule a refund belongs to (-1: the current one). local marks the
// local limiter's debits, for the reconciled-units metric.
type adjustment struct {
	in    *instance
	at    int64
	delta int64
	local bool
}

func (p *pending) init(max int) {
	p.max = max
	p.adj = map[adjKey]*adjustment{}
	p.insts = map[*instance]struct{}{}
}

func (p *pending) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lenLocked()
}

func (p *pending) lenLocked() int { return len(p.adj) + len(p.insts) + len(p.calls) }

// add queues a correction, merging it with one for the same instance and
// granule; it reports false (and counts the drop) when the queue is full.
func (p *pending) add(l *Limiter, in *instance, delta, at int64) bool {
	if delta == 0 {
		return true
	}
	if delta > 0 || !in.r.dated() {
		at = -1 // charges go to the current granule or period; buckets have none
	}
	k := adjKey{in.key, at}
	p.mu.Lock()
	defer p.mu.Unlock()
	if a := p.adj[k]; a != nil {
		a.delta += delta
		return true
	}
	if p.lenLocked() >= p.max {
		l.m.dropped.Inc()
		return false
	}
	p.adj[k] = &adjustment{in: in, at: at, delta: delta}
	return true
}

// addInstance lists an instance whose local debits await Redis. It is not
// bounded by max: an instance is listed at most once and instances are
// bounded by WithMaxInstances.
func (p *pending) addInstance(in *instance) {
	p.mu.Lock()
	p.insts[in] = struct{}{}
	p.mu.Unlock()
}

// queue adds sealed calls (a settlement, refunds Redis did not take) whole
// or not at all; it reports false (and counts the drop) when they do not
// fit.
func (p *pending) queue(l *Limiter, calls []markedCall) bool {
	if len(calls) == 0 {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lenLocked()+len(calls) > p.max {
		l.m.dropped.Inc()
		return false
	}
	p.calls = append(p.calls, calls...)
	return true
}

// requeue puts back sealed calls Redis did not answer, ahead of the
// others; they are never dropped, since they were counted against the
// bound when first queued (sealing never makes more entries than it
// takes).
func (p *pending) requeue(calls []markedCall) {
	if len(calls) == 0 {
		return
	}
	p.mu.Lock()
	p.calls = append(calls, p.calls...)
	p.mu.Unlock()
}

// flush sends what waits to Redis: first the sealed calls, as they are;
// only once Redis has answered all of them are the open corrections
// sealed (with a marker of a new batch) and sent. What Redis did not
// answer stays queued and the error is returned.
func (p *pending) flush(ctx context.Context, l *Limiter) error {
	p.mu.Lock()
	sealed := p.calls
	p.calls = nil
	p.mu.Unlock()
	if err := p.send(ctx, l, sealed); err != nil {
		return err
	}

	p.mu.Lock()
	adj, insts := p.adj, p.insts
	p.adj, p.insts = map[adjKey]*adjustment{}, map[*instance]struct{}{}
	p.mu.Unlock()
	list := make([]adjustment, 0, len(adj)+len(insts))
	for _, a := range adj {
		list = append(list, *a)
	}
	for in := range insts {
		if d := in.takePending(); d != 0 {
			list = append(list, adjustment{in: in, at: -1, delta: d, local: true})
		}
	}
	return p.send(ctx, l, l.seal(list, batchMarker(l.newID())))
}

func (p *pending) send(ctx context.Context, l *Limiter, calls []markedCall) error {
	if len(calls) == 0 {
		return nil
	}
	failed, err := l.applyMarked(ctx, calls)
	p.requeue(failed)
	return err
}

package admission

import (
	"context"
	"sync"
)

// pending holds the corrections Redis has not taken yet: lease rests,
// refunds that could not be sent, settlements made while Redis was
// unreachable, and (through the instances listed in insts) the local
// limiter's debits. It is bounded by WithMaxPending; see there.
type pending struct {
	mu      sync.Mutex
	max     int
	adj     map[adjKey]*adjustment
	insts   map[*instance]struct{}
	settles []deferredSettle
}

type adjKey struct {
	key string
	at  int64
}

// adjustment is one signed correction of one instance; at is the window
// granule a refund belongs to (-1: the current one).
type adjustment struct {
	in    *instance
	at    int64
	delta int64
}

type deferredSettle struct {
	id   string
	adjs []adjustment
}

func (p *pending) init(max int) {
	p.max = max
	p.adj = map[adjKey]*adjustment{}
	p.insts = map[*instance]struct{}{}
}

func (p *pending) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.adj) + len(p.insts) + len(p.settles)
}

func (p *pending) fullLocked() bool { return len(p.adj)+len(p.insts)+len(p.settles) >= p.max }

// add queues a correction, merging it with one for the same instance and
// granule; it reports false (and counts the drop) when the queue is full.
func (p *pending) add(l *Limiter, in *instance, delta, at int64) bool {
	if delta == 0 {
		return true
	}
	if delta > 0 || in.r.gran == 0 {
		at = -1 // charges go to the current granule; buckets have none
	}
	k := adjKey{in.key, at}
	p.mu.Lock()
	defer p.mu.Unlock()
	if a := p.adj[k]; a != nil {
		a.delta += delta
		return true
	}
	if p.fullLocked() {
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

func (p *pending) deferSettle(l *Limiter, id string, adjs []adjustment) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fullLocked() {
		l.m.dropped.Inc()
		return false
	}
	p.settles = append(p.settles, deferredSettle{id: id, adjs: adjs})
	return true
}

// flush sends every pending correction to Redis. What Redis did not take
// stays queued and the error is returned.
func (p *pending) flush(ctx context.Context, l *Limiter) error {
	p.mu.Lock()
	adj, insts, settles := p.adj, p.insts, p.settles
	p.adj, p.insts, p.settles = map[adjKey]*adjustment{}, map[*instance]struct{}{}, nil
	p.mu.Unlock()

	list := make([]adjustment, 0, len(adj)+len(insts))
	var local int64
	for _, a := range adj {
		list = append(list, *a)
	}
	for in := range insts {
		if d := in.takePending(); d != 0 {
			list = append(list, adjustment{in: in, at: -1, delta: d})
			local += max(d, 0)
		}
	}
	if len(list) > 0 {
		if err := l.adjust(ctx, list); err != nil {
			for _, a := range list {
				p.readd(a)
			}
			p.requeueSettles(settles)
			return err
		}
		l.m.reconciled.Add(float64(local))
	}
	for i, s := range settles {
		if err := l.settleRedis(ctx, s.id, s.adjs); err != nil {
			p.requeueSettles(settles[i:])
			return err
		}
	}
	return nil
}

// readd puts back a correction Redis did not take; it is never dropped,
// since it was counted against the bound when first queued.
func (p *pending) readd(a adjustment) {
	k := adjKey{a.in.key, a.at}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.adj[k]; b != nil {
		b.delta += a.delta
		return
	}
	p.adj[k] = &a
}

func (p *pending) requeueSettles(s []deferredSettle) {
	if len(s) == 0 {
		return
	}
	p.mu.Lock()
	p.settles = append(s, p.settles...)
	p.mu.Unlock()
}

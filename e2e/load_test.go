package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// loader posts batches of usage events straight to ingest and remembers
// every event whose request got a 2xx: the events Sluice promised to keep.
// A refused batch (503, connection error while a dependency is down) is
// retried unchanged, as a gateway's Emitter does, so ingest's dedup is what
// keeps a retried event from counting twice. With several ingest replicas
// (stack.ingests) batches go to each in turn, and a refused one is retried
// on the next, as behind a load balancer; then the aggregator's dedup by
// id is what keeps it from counting twice.
type loader struct {
	s       *stack
	tenants []string
	batch   int
	every   time.Duration

	mu      sync.Mutex
	acked   map[string]map[string]uint64
	refused int

	cancel context.CancelFunc
	done   chan struct{}
}

func startLoader(t testing.TB, s *stack, batch int, every time.Duration, tenants ...string) *loader {
	l := &loader{s: s, tenants: tenants, batch: batch, every: every, acked: map[string]map[string]uint64{}, done: make(chan struct{})}
	for _, tn := range tenants {
		l.acked[tn] = map[string]uint64{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go l.run(ctx, randomKey()[7:15])
	t.Cleanup(l.stop)
	return l
}

func (l *loader) run(ctx context.Context, run string) {
	defer close(l.done)
	seq, next := 0, 0
	tick := time.NewTicker(l.every)
	defer tick.Stop()
	for ctx.Err() == nil {
		ids := make(map[string]string, l.batch)
		toks := make(map[string]uint64, l.batch)
		body := []byte{'['}
		now := time.Now()
		for i := 0; i < l.batch; i++ {
			seq++
			tn := l.tenants[seq%len(l.tenants)]
			id := fmt.Sprintf("load-%s-%d", run, seq)
			ids[id], toks[id] = tn, uint64(seq%50+2)
			if i > 0 {
				body = append(body, ',')
			}
			body = append(body, eventJSON(id, tn, now, int64(seq%50+1), 1)...)
		}
		body = append(body, ']')
		// Once produced, a batch is retried until acknowledged even after
		// stop: an event the broker took after a 503 is stored, and the
		// books must know it.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			rctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			addr := l.s.ingests[next%len(l.s.ingests)]
			next++
			code, _, _, err := l.s.postEventsTo(rctx, addr, l.s.ingestKey, "application/json", body)
			cancel()
			if err == nil && code == 202 {
				break
			}
			l.mu.Lock()
			l.refused++
			l.mu.Unlock()
			if time.Now().After(deadline) {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		l.mu.Lock()
		for id, tn := range ids {
			l.acked[tn][id] = toks[id]
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// stop ends the load after the batch in flight is acknowledged.
func (l *loader) stop() {
	l.cancel()
	<-l.done
}

// ackedCount is how many events were acknowledged so far.
func (l *loader) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.acked {
		n += len(m)
	}
	return n
}

// snapshot returns a copy of the acknowledged events.
func (l *loader) snapshot() map[string]map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]map[string]uint64, len(l.acked))
	for tn, m := range l.acked {
		c := make(map[string]uint64, len(m))
		for id, v := range m {
			c[id] = v
		}
		out[tn] = c
	}
	return out
}

// waitProgress waits until at least n more events were acknowledged.
func (l *loader) waitProgress(t testing.TB, n int) {
	t.Helper()
	target := l.ackedCount() + n
	itest.EventuallyNoError(t, waitTimeout, fmt.Sprintf("load reaches %d acknowledged events", target), func() error {
		if c := l.ackedCount(); c < target {
			return fmt.Errorf("%d acknowledged", c)
		}
		return nil
	})
}

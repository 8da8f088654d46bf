package upstream

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/internal/manualclock"
	"github.com/sluicehq/sluice/sdk/go/priority"
)

const within = 10 * time.Second

// mockUpstream is an httptest upstream with a fixed capacity: beyond
// capacity calls in flight it answers 429, as a provider's concurrency
// limit does. Calls wait for hold (when set) so tests decide when each
// finishes; fail makes every answer a 503.
type mockUpstream struct {
	srv      *httptest.Server
	capacity int64
	inflight atomic.Int64
	fail     atomic.Bool
	hold     chan struct{}

	mu   sync.Mutex
	seen []string // X-Id of each call, in arrival order
}

func newMock(t *testing.T, capacity int64, hold bool) *mockUpstream {
	m := &mockUpstream{capacity: capacity}
	if hold {
		m.hold = make(chan struct{})
	}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := m.inflight.Add(1)
		defer m.inflight.Add(-1)
		m.mu.Lock()
		m.seen = append(m.seen, r.Header.Get("X-Id"))
		m.mu.Unlock()
		if n > m.capacity {
			http.Error(w, "over capacity", http.StatusTooManyRequests)
			return
		}
		if m.hold != nil {
			<-m.hold
		}
		if m.fail.Load() {
			http.Error(w, "upstream down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mockUpstream) arrivals() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.seen)
}

// outcome classifies an upstream answer as a gateway would.
func outcome(resp *http.Response, err error) concurrency.Outcome {
	if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		return concurrency.Failure
	}
	return concurrency.Success
}

// do acquires through g, calls the mock, releases with the outcome, and
// returns the decision.
func (m *mockUpstream) do(g *Guard, r Request, id string) priority.Decision {
	p, d := g.Acquire(context.Background(), r)
	if !d.Admitted() {
		return d
	}
	req, _ := http.NewRequest(http.MethodPost, m.srv.URL, nil)
	req.Header.Set("X-Id", id)
	resp, err := m.srv.Client().Do(req)
	if err == nil {
		resp.Body.Close()
	}
	p.Release(outcome(resp, err))
	return d
}

func newGuard(t *testing.T, opts ...Opt) *Guard {
	t.Helper()
	g, err := New("mock", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGuardBreakerOpensForEveryTenantAfterTenFailures: ten consecutive
// 503s from the upstream, whichever tenants sent them, open its breaker;
// the next request of any tenant and class is refused at once with 503
// and Retry-After 30 s, without reaching the upstream.
func TestGuardBreakerOpensForEveryTenantAfterTenFailures(t *testing.T) {
	m := newMock(t, 100, false)
	m.fail.Store(true)
	g := newGuard(t, Clock(manualclock.New(t0)))
	for i := range 10 {
		if d := m.do(g, Request{Tenant: fmt.Sprint("t", i%3), Priority: schemas.PriorityNormal}, fmt.Sprint(i)); !d.Admitted() {
			t.Fatalf("call %d refused before the breaker opened: %+v", i, d)
		}
	}
	d := m.do(g, Request{Tenant: "other", Priority: schemas.PriorityCritical}, "after")
	if d.Reason != priority.BreakerOpen || d.Status() != http.StatusServiceUnavailable || d.RetryAfter != 30*time.Second {
		t.Fatalf("after 10 failures: %+v (status %d), want breaker_open, 503, 30s", d, d.Status())
	}
	if n := len(m.arrivals()); n != 10 {
		t.Fatalf("the upstream saw %d calls, want 10: the refused one must not reach it", n)
	}
	if s := g.Stats(); s.Breaker.State != Open || s.Level != priority.Level3 {
		t.Fatalf("stats %+v: want the breaker open and degradation level 3", s)
	}
}

// TestGuardServesClassesInOrderAgainstAFixedCapacityUpstream: two slots
// against an upstream of capacity 2; the requests that queue behind them
// reach the upstream highest class first and in arrival order within a
// class, and the upstream never sees more than its capacity.
func TestGuardServesClassesInOrderAgainstAFixedCapacityUpstream(t *testing.T) {
	m := newMock(t, 2, true)
	g := newGuard(t, Limit(concurrency.Fixed(2)),
		QueueOptions(priority.MinShare(schemas.PriorityHigh, 0), priority.MinShare(schemas.PriorityNormal, 0), priority.MinShare(schemas.PriorityLow, 0)))
	var wg sync.WaitGroup
	start := func(id string, c schemas.Priority) {
		wg.Go(func() {
			if d := m.do(g, Request{Tenant: "t-" + id, Priority: c}, id); !d.Admitted() {
				t.Errorf("%s refused: %+v", id, d)
			}
		})
	}
	start("first", schemas.PriorityLow)
	start("second", schemas.PriorityLow)
	itest.Eventually(t, within, "two calls at the upstream", func() bool { return m.inflight.Load() == 2 })
	order := []struct {
		id string
		c  schemas.Priority
	}{{"low1", schemas.PriorityLow}, {"normal1", schemas.PriorityNormal}, {"crit1", schemas.PriorityCritical}, {"low2", schemas.PriorityLow}, {"high1", schemas.PriorityHigh}, {"crit2", schemas.PriorityCritical}, {"normal2", schemas.PriorityNormal}}
	for i, r := range order {
		start(r.id, r.c)
		itest.Eventually(t, within, r.id+" queued", func() bool { return g.queue.Waiting() == i+1 })
	}
	for k := range order {
		m.hold <- struct{}{} // finish one call; the next in line takes its slot
		itest.Eventually(t, within, "the next call at the upstream", func() bool { return len(m.arrivals()) == 3+k })
	}
	m.hold <- struct{}{}
	m.hold <- struct{}{}
	wg.Wait()
	got := m.arrivals()[2:]
	want := []string{"crit1", "crit2", "high1", "normal1", "normal2", "low1", "low2"}
	if !slices.Equal(got, want) {
		t.Fatalf("the upstream saw %v, want %v", got, want)
	}
	if g.Stats().InFlight != 0 {
		t.Fatal("slots leaked")
	}
}

// TestGuardTenantShare: with each tenant held to half of a limit of 4,
// a tenant's third concurrent request is refused with 429 while another
// tenant is still admitted.
func TestGuardTenantShare(t *testing.T) {
	g := newGuard(t, Limit(concurrency.Fixed(4)), TenantShare(0.5))
	ctx := context.Background()
	var ps []Permit
	for range 2 {
		p, d := g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityCritical})
		if !d.Admitted() {
			t.Fatalf("tenant a within its share refused: %+v", d)
		}
		ps = append(ps, p)
	}
	_, d := g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityCritical})
	if d.Reason != priority.TenantLimit || d.Status() != http.StatusTooManyRequests || d.RetryAfter < time.Second {
		t.Fatalf("tenant a over its share: %+v, want tenant_concurrency 429 with Retry-After", d)
	}
	p, d := g.Acquire(ctx, Request{Tenant: "b", Priority: schemas.PriorityLow})
	if !d.Admitted() {
		t.Fatalf("tenant b refused: %+v", d)
	}
	p.Release(concurrency.Success)
	for _, p := range ps {
		p.Release(concurrency.Success)
	}
	if g.InFlightOf("a") != 0 || g.Stats().InFlight != 0 {
		t.Fatal("slots leaked")
	}
}

// TestGuardDegradesUnderLoad: with a limit of 1 and a queue of 3, one
// call in flight and two waiting make the load 3/4 = 75%: level 2 admits
// only critical; a high request is refused at once as degraded.
func TestGuardDegradesUnderLoad(t *testing.T) {
	clock := manualclock.New(t0)
	g := newGuard(t, Limit(concurrency.Fixed(1)), QueueOptions(priority.MaxWaiting(3)), Clock(clock))
	ctx := context.Background()
	holder, _ := g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityLow})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			p, d := g.Acquire(ctx, Request{Tenant: "b", Priority: schemas.PriorityCritical})
			if !d.Admitted() {
				t.Errorf("critical %d refused: %+v", i, d)
			}
			p.Release(concurrency.Success)
		})
		itest.Eventually(t, within, "critical waiting", func() bool { return g.Stats().Queue.Waiting[schemas.PriorityCritical.Index()] == i+1 })
	}
	_, d := g.Acquire(ctx, Request{Tenant: "c", Priority: schemas.PriorityHigh})
	if d.Reason != priority.Degraded || d.Level != priority.Level2 || d.Status() != http.StatusServiceUnavailable || d.RetryAfter != 30*time.Second {
		t.Fatalf("high at 75%% load: %+v, want degraded level 2, 503, 30s", d)
	}
	holder.Release(concurrency.Success)
	wg.Wait()
	// Load is back to 0: the next request of any class passes.
	p, d := g.Acquire(ctx, Request{Tenant: "c", Priority: schemas.PriorityLow})
	if !d.Admitted() {
		t.Fatalf("low after the load fell: %+v", d)
	}
	p.Release(concurrency.Success)
}

// TestGuardAdaptiveLimitFollowsSeed003: through a Guard, slow answers
// shrink the upstream limit at the 10 s adjustments and fast answers grow
// it back, on the injected clock.
func TestGuardAdaptiveLimitFollowsSeed003(t *testing.T) {
	clock := manualclock.New(t0)
	th, err := concurrency.NewThreshold(concurrency.InitialLimit(10), concurrency.MaxLimit(10))
	if err != nil {
		t.Fatal(err)
	}
	var changes [][2]int
	g := newGuard(t, Limit(th), Clock(clock), OnLimitChange(func(o, n int) { changes = append(changes, [2]int{o, n}) }))
	ctx := context.Background()
	// round runs as many calls in parallel as the limit allows, each
	// taking latency, then idles until 10 s have passed.
	round := func(latency time.Duration) {
		var ps []Permit
		for range g.Stats().Queue.Limit {
			p, d := g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityNormal})
			if !d.Admitted() {
				t.Fatalf("refused: %+v", d)
			}
			ps = append(ps, p)
		}
		clock.Advance(latency)
		for _, p := range ps {
			p.Release(concurrency.Success)
		}
		clock.Advance(10*time.Second - latency)
	}
	for range 3 {
		round(3 * time.Second)
	}
	low := g.Stats().Queue.Limit
	if len(changes) == 0 || changes[0] != [2]int{10, 8} || low >= 8 {
		t.Fatalf("after 30 s of 3 s answers: limit %d, changes %v; want 10→8 first, then lower", low, changes)
	}
	// Fast answers: once the slow calls have left the 60 s window the
	// limit grows ×1.2 per adjustment back to its maximum.
	for range 12 {
		round(100 * time.Millisecond)
	}
	if l := g.Stats().Queue.Limit; l != 10 {
		t.Fatalf("limit after two minutes of fast answers = %d, want 10; changes %v", l, changes)
	}
	last := changes[len(changes)-1]
	if last[1] != 10 || last[0] >= 10 || float64(last[1]) > float64(last[0])*1.2+1 {
		t.Fatalf("the last change %v is not a ×1.2 step up to 10", last)
	}
}

// TestGuardShortensInsteadOfRefusing: with level 1 set to shorten, a
// low request that level 1 refuses is admitted with Shortened set (the
// caller caps its output), a critical one passes whole, and level 2,
// which does not shorten, still refuses a normal request.
func TestGuardShortensInsteadOfRefusing(t *testing.T) {
	var load atomic.Uint64 // float64 bits
	setLoad := func(f float64) { load.Store(math.Float64bits(f)) }
	g := newGuard(t, ShortenAt(priority.Level1), LoadFunc(func(Load) float64 { return math.Float64frombits(load.Load()) }))
	ctx := context.Background()
	setLoad(0.6) // level 1
	p, d := g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityLow})
	if !d.Admitted() || !p.Shortened() {
		t.Fatalf("low at level 1: %+v, shortened %v; want admitted shortened", d, p.Shortened())
	}
	p.Release(concurrency.Success)
	p, d = g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityCritical})
	if !d.Admitted() || p.Shortened() {
		t.Fatalf("critical at level 1: %+v, shortened %v; want admitted whole", d, p.Shortened())
	}
	p.Release(concurrency.Success)
	setLoad(0.8) // level 2
	if _, d := g.Acquire(ctx, Request{Tenant: "a", Priority: schemas.PriorityNormal}); d.Reason != priority.Degraded || d.Level != priority.Level2 {
		t.Fatalf("normal at level 2: %+v, want refused as degraded", d)
	}
	if _, err := New("u", ShortenAt(0)); err == nil {
		t.Fatal("ShortenAt(0) accepted; want an error naming the level range")
	}
}

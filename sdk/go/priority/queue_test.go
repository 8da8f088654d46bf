package priority

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/internal/manualclock"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const within = 10 * time.Second

type fixture struct {
	q     *Queue
	gate  *concurrency.Limiter
	clock *manualclock.Clock
}

func newFixture(t *testing.T, slots int, opts ...QueueOpt) *fixture {
	t.Helper()
	clock := manualclock.New(t0)
	gate := concurrency.NewLimiter(concurrency.Fixed(slots), concurrency.Clock(clock.Now))
	q, err := NewQueue(gate, append([]QueueOpt{WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{q: q, gate: gate, clock: clock}
}

// strict turns the minimum shares off: pure priority order.
var strict = []QueueOpt{MinShare(High, 0), MinShare(Normal, 0), MinShare(Low, 0)}

type result struct {
	id string
	p  Permit
	d  Decision
}

// enqueue starts a request that waits; it returns once the request is
// in the queue, so tests control the arrival order.
func (f *fixture) enqueue(t *testing.T, ctx context.Context, id string, c schemas.Priority, deadline time.Time, out chan<- result) {
	t.Helper()
	before := f.q.Waiting()
	go func() {
		p, d := f.q.Acquire(ctx, c, deadline)
		out <- result{id, p, d}
	}()
	itest.Eventually(t, within, id+" waiting", func() bool { return f.q.Waiting() == before+1 })
}

func (f *fixture) hold(t *testing.T, n int) []Permit {
	t.Helper()
	var ps []Permit
	for range n {
		p, d := f.q.Acquire(context.Background(), Critical, time.Time{})
		if !d.Admitted() {
			t.Fatalf("holding a free slot: %+v", d)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestQueueServesClassesInOrderAndFIFOWithin: with one slot busy,
// requests of every class arrive interleaved; as the slot frees they are
// served highest class first and in arrival order within a class.
func TestQueueServesClassesInOrderAndFIFOWithin(t *testing.T) {
	f := newFixture(t, 1, strict...)
	holder := f.hold(t, 1)[0]
	out := make(chan result, 16)
	arrivals := []struct {
		id string
		c  schemas.Priority
	}{{"low1", Low}, {"normal1", Normal}, {"crit1", Critical}, {"high1", High}, {"low2", Low}, {"crit2", Critical}, {"normal2", Normal}, {"high2", High}, {"crit3", Critical}}
	for _, a := range arrivals {
		f.enqueue(t, context.Background(), a.id, a.c, time.Time{}, out)
	}
	holder.Release(concurrency.Success)
	var order []string
	for range arrivals {
		r := <-out
		if !r.d.Admitted() {
			t.Fatalf("%s refused: %+v", r.id, r.d)
		}
		order = append(order, r.id)
		r.p.Release(concurrency.Success) // frees the slot for the next
	}
	want := []string{"crit1", "crit2", "crit3", "high1", "high2", "normal1", "normal2", "low1", "low2"}
	if !slices.Equal(order, want) {
		t.Fatalf("served %v, want %v", order, want)
	}
}

// serveAll releases the holder and serves every waiter one at a time,
// returning the classes in the order they were served.
func serveAll(t *testing.T, holder Permit, out <-chan result, n int) []schemas.Priority {
	t.Helper()
	holder.Release(concurrency.Success)
	var order []schemas.Priority
	for range n {
		r := <-out
		if !r.d.Admitted() {
			t.Fatalf("%s refused: %+v", r.id, r.d)
		}
		order = append(order, r.d.Priority)
		r.p.Release(concurrency.Success)
	}
	return order
}

// TestQueueLowIsNotStarved: with the default shares, low requests waiting
// behind a stream of high ones get one slot in 21 (passed over 20 times
// at 5% each, they take the next), and high ones the rest.
func TestQueueLowIsNotStarved(t *testing.T) {
	f := newFixture(t, 1)
	holder := f.hold(t, 1)[0]
	out := make(chan result, 100)
	for i := range 3 {
		f.enqueue(t, context.Background(), fmt.Sprint("low", i), Low, time.Time{}, out)
	}
	for i := range 60 {
		f.enqueue(t, context.Background(), fmt.Sprint("high", i), High, time.Time{}, out)
	}
	order := serveAll(t, holder, out, 63)
	var lows []int
	for i, c := range order {
		if c == Low {
			lows = append(lows, i)
		}
	}
	if !slices.Equal(lows, []int{20, 41, 62}) {
		t.Fatalf("low served at positions %v of %d, want 20, 41, 62 (one in 21)", lows, len(order))
	}
}

// TestQueueSharesUnderFullLoad: with all four classes waiting far more
// than one turn, critical takes every slot while it waits; then each of
// normal and low gets its minimum share of the slots — share/(1+share),
// one in 11 and one in 21 — and high the rest.
func TestQueueSharesUnderFullLoad(t *testing.T) {
	f := newFixture(t, 1, MaxWaiting(1000))
	holder := f.hold(t, 1)[0]
	out := make(chan result, 900)
	for _, c := range []schemas.Priority{Low, Normal, High, Critical} {
		for i := range 200 {
			go func() {
				p, d := f.q.Acquire(context.Background(), c, time.Time{})
				out <- result{fmt.Sprint(c, i), p, d}
			}()
		}
	}
	itest.Eventually(t, within, "800 waiting", func() bool { return f.q.Waiting() == 800 })
	holder.Release(concurrency.Success)
	serve := func(n int) (got [schemas.NumPriorities]int) {
		for range n {
			r := <-out
			got[r.d.Priority.Index()]++
			r.p.Release(concurrency.Success)
		}
		return got
	}
	if got := serve(200); got[schemas.PriorityCritical.Index()] != 200 {
		t.Fatalf("first 200 slots went %v, want all to the 200 critical requests", got)
	}
	// 210 slots, fewer than it takes high to run out of requests.
	got := serve(210)
	for c, want := range map[schemas.Priority]int{High: 181, Normal: 19, Low: 10} {
		if n := got[c.Index()]; n < want-2 || n > want+2 {
			t.Errorf("%s got %d of 210 slots, want %d±2", c, n, want)
		}
	}
	serve(390) // drain, so no goroutine is left waiting
}

// warm teaches the queue that a slot is held for hold: every slot is
// taken and released once after hold on the manual clock.
func (f *fixture) warm(t *testing.T, slots int, hold time.Duration) {
	t.Helper()
	ps := f.hold(t, slots)
	f.clock.Advance(hold)
	for _, p := range ps {
		p.Release(concurrency.Success)
	}
}

// TestQueueRefusesAtOnceWhenTheWaitExceedsTheDeadline: with 2 slots held
// 1 s each (2 served per second), a request that would wait 500 ms is
// refused on arrival if its deadline is sooner, queued otherwise; the
// estimate counts only requests of its class and above, plus the share
// lower classes take.
func TestQueueRefusesAtOnceWhenTheWaitExceedsTheDeadline(t *testing.T) {
	f := newFixture(t, 2)
	f.warm(t, 2, time.Second)
	f.hold(t, 2)
	now := f.clock.Now()
	ctx := context.Background()

	_, d := f.q.Acquire(ctx, Normal, now.Add(400*time.Millisecond))
	if d.Reason != Deadline || d.Estimate != 500*time.Millisecond || d.Status() != 503 || d.RetryAfter < time.Second {
		t.Fatalf("deadline 400 ms, estimated wait 500 ms: got %+v (status %d)", d, d.Status())
	}
	out := make(chan result, 4)
	f.enqueue(t, ctx, "normal1", Normal, now.Add(600*time.Millisecond), out)
	if _, d := f.q.Acquire(ctx, Normal, now.Add(900*time.Millisecond)); d.Reason != Deadline || d.Estimate != time.Second {
		t.Fatalf("second normal behind one: want refused with a 1 s estimate, got %+v", d)
	}
	// A high request does not wait for the normal one; only the 10% share
	// normal may take slows it: 1 / (2 × (1 − 0.1/1.1)) = 550 ms.
	if _, d := f.q.Acquire(ctx, High, now.Add(540*time.Millisecond)); d.Reason != Deadline || d.Estimate != 550*time.Millisecond {
		t.Fatalf("high with a 540 ms deadline: want refused with a 550 ms estimate, got %+v", d)
	}
	// Nothing takes slots from critical: 500 ms.
	f.enqueue(t, ctx, "crit1", Critical, now.Add(540*time.Millisecond), out)
	if f.clock.Now() != now {
		t.Fatal("refusals must not wait")
	}
	if s := f.q.Stats(); s.Refused[schemas.PriorityNormal.Index()] != 2 || s.Refused[schemas.PriorityHigh.Index()] != 1 || s.ServiceRate != 2 {
		t.Fatalf("stats %+v", s)
	}
	f.clock.Advance(time.Second) // both reach their deadlines
	for range 2 {
		if r := <-out; r.d.Reason != Expired {
			t.Fatalf("%s: %+v", r.id, r.d)
		}
	}
}

// TestQueueRefusesAtTheDeadlineNotAfter: a request whose estimate was
// too short is refused exactly at its deadline.
func TestQueueRefusesAtTheDeadlineNotAfter(t *testing.T) {
	f := newFixture(t, 1)
	f.hold(t, 1) // no release yet: the wait cannot be estimated
	out := make(chan result, 1)
	f.enqueue(t, context.Background(), "r", High, t0.Add(300*time.Millisecond), out)
	f.clock.Advance(299 * time.Millisecond)
	select {
	case r := <-out:
		t.Fatalf("refused before its deadline: %+v", r.d)
	default:
	}
	f.clock.Advance(time.Millisecond)
	r := <-out
	if r.d.Reason != Expired || r.d.Waited != 300*time.Millisecond || r.d.RetryAfter < time.Second || r.d.Status() != 503 {
		t.Fatalf("at its deadline: %+v", r.d)
	}
	if f.q.Waiting() != 0 || f.clock.Pending() != 0 {
		t.Fatalf("waiting %d, timers %d after expiry", f.q.Waiting(), f.clock.Pending())
	}
	if !strings.Contains(r.d.Message(), "reached its deadline after waiting 300ms") {
		t.Fatalf("message %q", r.d.Message())
	}
}

// TestQueueShedsTheLowestClassWhenFull: a full queue makes room for a
// newcomer by evicting the newest request of the lowest class below it;
// with nothing lower waiting, the newcomer is refused; the queue never
// holds more than its bound.
func TestQueueShedsTheLowestClassWhenFull(t *testing.T) {
	f := newFixture(t, 1, MaxWaiting(3))
	f.warm(t, 1, 2*time.Second)
	f.hold(t, 1)
	ctx := context.Background()
	out := make(chan result, 16)
	for i := range 3 {
		f.enqueue(t, ctx, fmt.Sprint("low", i), Low, time.Time{}, out)
	}
	shed := func(want string) {
		t.Helper()
		r := <-out
		if r.id != want || r.d.Reason != Shed || r.d.Status() != 503 || r.d.RetryAfter < time.Second {
			t.Fatalf("want %s shed, got %s: %+v", want, r.id, r.d)
		}
	}
	arrive := func(id string, c schemas.Priority) {
		t.Helper()
		go func() {
			p, d := f.q.Acquire(ctx, c, time.Time{})
			out <- result{id, p, d}
		}()
	}
	arrive("normal0", Normal)
	shed("low2") // newest of the lowest class
	arrive("crit0", Critical)
	shed("low1")
	arrive("normal1", Normal)
	shed("low0")
	itest.Eventually(t, within, "normal1 waiting", func() bool { return f.q.Stats().Waiting[schemas.PriorityNormal.Index()] == 2 })
	if _, d := f.q.Acquire(ctx, Low, time.Time{}); d.Reason != QueueFull || d.RetryAfter < time.Second {
		t.Fatalf("low into a queue full of higher classes: %+v", d)
	}
	if _, d := f.q.Acquire(ctx, Normal, time.Time{}); d.Reason != QueueFull {
		t.Fatalf("normal into a queue full of normal and critical: %+v", d)
	}
	arrive("crit1", Critical)
	shed("normal1")
	// normal1 hears of its shedding as crit1 takes its place: crit1 is
	// waiting once its Acquire has queued it, which the shed may precede.
	itest.Eventually(t, within, "crit1 waiting in normal1's place, the queue at its bound 3", func() bool { return f.q.Waiting() == 3 })
	s := f.q.Stats()
	if s.Waiting != [schemas.NumPriorities]int{0, 1, 0, 2} {
		t.Fatalf("waiting per class %v, want normal 1, critical 2", s.Waiting)
	}
	if s.Refused[schemas.PriorityCritical.Index()] != 0 {
		t.Fatal("critical was refused while lower classes waited")
	}
	f.clock.Advance(time.Minute)
	for range 3 {
		<-out
	}
}

// TestQueueStaysBoundedUnderConcurrentLoad: many goroutines of random
// classes against 4 slots and 10 places: the queue never holds more than
// 10, every request gets exactly one answer, and every slot comes back.
func TestQueueStaysBoundedUnderConcurrentLoad(t *testing.T) {
	gate := concurrency.NewLimiter(concurrency.Fixed(4))
	q, err := NewQueue(gate, MaxWaiting(10), MaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var over atomic.Int64
	stop := make(chan struct{})
	var mon sync.WaitGroup
	mon.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := q.Waiting(); n > 10 {
				over.Store(int64(n))
			}
		}
	})
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			c := schemas.Priorities[rand.IntN(schemas.NumPriorities)]
			p, d := q.Acquire(context.Background(), c, time.Time{})
			if !d.Admitted() {
				refused.Add(1)
				return
			}
			admitted.Add(1)
			if i%3 == 0 {
				time.Sleep(50 * time.Microsecond) // hold the slot a little
			}
			p.Release(concurrency.Success)
		})
	}
	wg.Wait()
	close(stop)
	mon.Wait()
	if n := over.Load(); n > 0 {
		t.Fatalf("the queue held %d requests, bound 10", n)
	}
	if admitted.Load()+refused.Load() != 400 || admitted.Load() == 0 {
		t.Fatalf("admitted %d + refused %d != 400", admitted.Load(), refused.Load())
	}
	if gate.InFlight() != 0 || q.Waiting() != 0 {
		t.Fatalf("in flight %d, waiting %d after the load", gate.InFlight(), q.Waiting())
	}
}

// TestQueueCancelLeavesNoTrace: a waiter whose context ends is answered
// Canceled, leaves the queue and its timer, and does not take a slot.
func TestQueueCancelLeavesNoTrace(t *testing.T) {
	f := newFixture(t, 1)
	holder := f.hold(t, 1)[0]
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan result, 2)
	f.enqueue(t, ctx, "gone", Normal, time.Time{}, out)
	f.enqueue(t, context.Background(), "next", Low, time.Time{}, out)
	cancel()
	if r := <-out; r.id != "gone" || r.d.Reason != Canceled || r.d.Status() != StatusClientClosedRequest {
		t.Fatalf("%s: %+v", r.id, r.d)
	}
	holder.Release(concurrency.Success)
	r := <-out
	if r.id != "next" || !r.d.Admitted() {
		t.Fatalf("%s: %+v", r.id, r.d)
	}
	r.p.Release(concurrency.Success)
	if f.gate.InFlight() != 0 || f.clock.Pending() != 0 {
		t.Fatalf("in flight %d, timers %d", f.gate.InFlight(), f.clock.Pending())
	}
	if s := f.q.Stats(); s.Refused[schemas.PriorityNormal.Index()] != 0 {
		t.Fatal("a cancellation was counted as a refusal")
	}
}

func TestQueueOptionsAreValidated(t *testing.T) {
	_, err := NewQueue(concurrency.NewLimiter(concurrency.Fixed(1)), MaxWaiting(-1), MaxWait(0), MinShare(Low, 0.4), MinShare(Normal, 0.3), MinShare(Critical, 0.1), MinShare(High, 0.6))
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"MaxWaiting: -1 is outside 0..1000000", "MaxWait: 0s is outside 1ms..1h", "MinShare: the shares add up to 0.85, more than 0.5", "MinShare(critical): critical has no share", "MinShare(high): 0.6 is outside 0..0.5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestQueueFastPathDoesNotAllocate: admitting with a free slot and no one
// waiting, and releasing, allocate nothing.
func TestQueueFastPathDoesNotAllocate(t *testing.T) {
	q, err := NewQueue(concurrency.NewLimiter(concurrency.Fixed(8)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		p, _ := q.Acquire(ctx, High, time.Time{})
		p.Release(concurrency.Success)
	}); n != 0 {
		t.Fatalf("%v allocations per admit and release", n)
	}
}

// TestQueueReleaseBeforeTheNewcomerQueuesIsNotLost: the only slot is
// released after a newcomer found it taken and before the newcomer joined
// the queue (the hook puts the release exactly there). The release then
// finds no one waiting to hand the slot to, so the newcomer itself must
// take it once it is queued, at once, not at its deadline (which the
// manual clock never reaches: only the test's context, a failure guard,
// would end the wait).
func TestQueueReleaseBeforeTheNewcomerQueuesIsNotLost(t *testing.T) {
	f := newFixture(t, 1)
	holder := f.hold(t, 1)[0]
	hooked := 0
	f.q.beforePush = func() {
		if hooked++; hooked == 1 {
			holder.Release(concurrency.Success) // no one waits yet: nothing to wake
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	p, d := f.q.Acquire(ctx, Normal, time.Time{})
	if hooked != 1 {
		t.Fatalf("the hook ran %d times, want once: the newcomer did not take the queue's slow path", hooked)
	}
	if !d.Admitted() {
		t.Fatalf("the newcomer was not admitted although the slot was free (%d of %d taken): %+v — the release was lost",
			f.gate.InFlight(), f.gate.Limit(), d)
	}
	p.Release(concurrency.Success)
	if f.gate.InFlight() != 0 || f.q.Waiting() != 0 || f.clock.Pending() != 0 {
		t.Fatalf("in flight %d, waiting %d, timers %d after the call", f.gate.InFlight(), f.q.Waiting(), f.clock.Pending())
	}
}

// growingGate is a Gate whose capacity a test raises without any Release,
// as a Gate counting slots elsewhere may.
type growingGate struct{ limit, inflight atomic.Int64 }

func (g *growingGate) TryAcquire() bool {
	for {
		n := g.inflight.Load()
		if n >= g.limit.Load() {
			return false
		}
		if g.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}
func (g *growingGate) Release(time.Duration, concurrency.Outcome) { g.inflight.Add(-1) }
func (g *growingGate) Limit() int                                 { return int(g.limit.Load()) }
func (g *growingGate) InFlight() int                              { return int(g.inflight.Load()) }

// TestQueueExpiryHandsOutAFreeSlot: a slot became free without a
// Release (the Gate grew); when a waiter expires, the queue hands the
// free slot to the next waiter instead of leaving it queued beside a free
// slot until some other call ends.
func TestQueueExpiryHandsOutAFreeSlot(t *testing.T) {
	clock := manualclock.New(t0)
	gate := &growingGate{}
	gate.limit.Store(1)
	q, err := NewQueue(gate, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{q: q, clock: clock}
	f.hold(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out := make(chan result, 2)
	f.enqueue(t, ctx, "soon", High, t0.Add(100*time.Millisecond), out)
	f.enqueue(t, ctx, "later", Normal, time.Time{}, out)
	gate.limit.Store(2)
	clock.Advance(100 * time.Millisecond)
	got := map[string]result{}
	for range 2 {
		r := <-out // both answer, in either order
		got[r.id] = r
	}
	if d := got["soon"].d; d.Reason != Expired {
		t.Fatalf("soon: %+v, want expired", d)
	}
	r := got["later"]
	if !r.d.Admitted() {
		t.Fatalf("later: %+v, want admitted to the free slot when soon expired", r.d)
	}
	r.p.Release(concurrency.Success)
}

// TestQueueEveryWaiterProgressesUnderRace: goroutines of random classes
// take and release a few slots as fast as they can, from as many
// goroutines as slots plus one (where a lost wake-up stalls everyone at
// once) to many. No deadline can rescue a lost wake-up (the manual clock
// never moves), so every request must be admitted by the slots the
// others release; the test's context is only a failure guard against a
// queue that stalls.
func TestQueueEveryWaiterProgressesUnderRace(t *testing.T) {
	for _, c := range []struct{ slots, workers, rounds int }{{1, 2, 5000}, {2, 3, 3000}, {3, 32, 300}} {
		t.Run(fmt.Sprintf("%d slots %d workers", c.slots, c.workers), func(t *testing.T) {
			f := newFixture(t, c.slots, MaxWaiting(c.workers))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for w := range c.workers {
				wg.Go(func() {
					for i := range c.rounds {
						class := schemas.Priorities[(w+i)%schemas.NumPriorities]
						p, d := f.q.Acquire(ctx, class, time.Time{})
						if !d.Admitted() {
							t.Errorf("worker %d round %d (%s): %+v; waiting %d, %d of %d slots taken", w, i, class, d,
								f.q.Waiting(), f.gate.InFlight(), f.gate.Limit())
							cancel() // the queue stalled: end the others' waits too
							return
						}
						admitted.Add(1)
						runtime.Gosched()
						p.Release(concurrency.Success)
					}
				})
			}
			wg.Wait()
			if n, want := admitted.Load(), int64(c.workers*c.rounds); n != want {
				t.Fatalf("%d of %d requests admitted", n, want)
			}
			if f.gate.InFlight() != 0 || f.q.Waiting() != 0 {
				t.Fatalf("in flight %d, waiting %d after the load", f.gate.InFlight(), f.q.Waiting())
			}
		})
	}
}

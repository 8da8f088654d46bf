package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/priority"
)

// twoGatewayReserves returns the Reserves of one upstream in two gateway
// processes, each with a Redis client of its own, under a prefix of the
// test's own: capacity 10 calls in flight, saturation 0.5, critical
// reserves half, low a fifth, the rest (0.3) is common.
func twoGatewayReserves(t *testing.T, unit ReserveUnit) (a, b *Reserve) {
	t.Helper()
	return reservesOf(t, ReserveConfig{Unit: unit, Capacity: 10, Saturation: 0.5,
		Shares: map[schemas.Priority]float64{schemas.PriorityCritical: 0.5, schemas.PriorityLow: 0.2}})
}

// reservesOf returns the Reserves c describes (its prefix, upstream and
// ids set here) in two gateway processes, each with a Redis client of
// its own.
func reservesOf(t *testing.T, c ReserveConfig) (a, b *Reserve) {
	t.Helper()
	rc := itest.Redis(t)
	c.Prefix, c.Upstream = itest.Unique(t, "sluice:test:reserve:"), "acct"
	// The tests check shares, not latency: a parallel `make test` on two
	// cores can take a Redis call past the 100 ms default and count an error.
	c.Timeout = 5 * time.Second
	mk := func(id string) *Reserve {
		cl := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { cl.Close() })
		c.ID = id
		r, err := NewReserve(cl, c)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	return mk("gw-a"), mk("gw-b")
}

// TestReservedSharesHoldAcrossTwoGateways: below the saturation threshold
// low priority borrows idle capacity beyond its share (5 calls, share 2);
// above it, neither gateway admits another low call (its share and the
// common part are used), while critical still finds its reserved half
// through the other gateway — up to the capacity and no further. Low's
// calls, once released, make room for low again.
func TestReservedSharesHoldAcrossTwoGateways(t *testing.T) {
	a, b := twoGatewayReserves(t, ReserveConcurrency)
	var low []Hold
	for i := range 5 {
		r := a
		if i%2 == 1 {
			r = b
		}
		h, ok := r.Take(schemas.PriorityLow, 1)
		if !ok {
			t.Fatalf("low call %d below the saturation threshold refused", i)
		}
		low = append(low, h)
	}
	if _, ok := b.Take(schemas.PriorityLow, 1); ok {
		t.Fatal("gateway b admitted a sixth low call above the threshold: low holds 5 = its share 2 + the common 3")
	}
	if _, ok := a.Take(schemas.PriorityNormal, 1); ok {
		t.Fatal("normal (no share) admitted while the common part is used up by low")
	}
	for i := range 5 {
		if _, ok := b.Take(schemas.PriorityCritical, 1); !ok {
			t.Fatalf("critical call %d refused within its reserved half", i)
		}
	}
	if _, ok := a.Take(schemas.PriorityCritical, 1); ok {
		t.Fatal("admitted beyond the capacity of 10")
	}
	if a.Refused(schemas.PriorityLow)+b.Refused(schemas.PriorityLow) != 1 || a.Refused(schemas.PriorityCritical) != 1 {
		t.Errorf("refusal counts: low %d+%d, critical %d", a.Refused(schemas.PriorityLow), b.Refused(schemas.PriorityLow), a.Refused(schemas.PriorityCritical))
	}
	low[0].Release()
	low[1].Release()
	if _, ok := a.Take(schemas.PriorityLow, 1); !ok {
		t.Error("low refused after two of its calls ended (low holds 3 of its share 2 + common 3)")
	}
	if a.RedisErrors()+b.RedisErrors() != 0 {
		t.Errorf("Redis errors: %d, %d", a.RedisErrors(), b.RedisErrors())
	}
}

// TestReservedRequestSharesAndTheGuard: requests per minute, through two
// Guards: idle capacity is lent below the threshold, and above it the
// Guard refuses low with class_share (503, Retry-After) while critical,
// through the other gateway, still finds its reserved share.
func TestReservedRequestSharesAndTheGuard(t *testing.T) {
	ra, rb := twoGatewayReserves(t, ReserveRequests)
	ga := newGuard(t, Limit(concurrency.Fixed(100)), Reserved(ra))
	gb := newGuard(t, Limit(concurrency.Fixed(100)), Reserved(rb))
	ctx := context.Background()
	for i := range 5 {
		p, d := ga.Acquire(ctx, Request{Tenant: "batch", Priority: schemas.PriorityLow})
		if !d.Admitted() {
			t.Fatalf("low request %d below the threshold: %+v", i, d)
		}
		p.Release(concurrency.Success) // a rate's use stays counted for its minute
	}
	_, d := gb.Acquire(ctx, Request{Tenant: "batch", Priority: schemas.PriorityLow})
	if d.Reason != priority.ClassShare || d.Status() != 503 || d.RetryAfter <= 0 {
		t.Fatalf("sixth low request above the threshold: %+v", d)
	}
	p, d := gb.Acquire(ctx, Request{Tenant: "app", Priority: schemas.PriorityCritical})
	if !d.Admitted() {
		t.Fatalf("critical within its share: %+v", d)
	}
	p.Release(concurrency.Success)
}

// TestTokenSharesSettleWithTheRealUsage: tokens per minute, capacity
// 1,000, saturation 50%, low reserves a tenth and critical the rest. A low
// call estimated at 400 tokens fills most of the threshold, so a second
// low call of 200 is refused; once the first settles at the 50 tokens it
// really used, the same call passes — through the other gateway. A call
// that used more than its estimate adds the rest: past the threshold
// again, low is refused. Settling a refused call's estimate (a Guard's
// queue refusal) at zero gives all of it back.
func TestTokenSharesSettleWithTheRealUsage(t *testing.T) {
	a, b := reservesOf(t, ReserveConfig{Unit: ReserveTokens, Capacity: 1000, Saturation: 0.5,
		Shares: map[schemas.Priority]float64{schemas.PriorityCritical: 0.9, schemas.PriorityLow: 0.1}})
	first, ok := a.Take(schemas.PriorityLow, 400)
	if !ok {
		t.Fatal("400 low tokens below the threshold of 500 refused")
	}
	if _, ok := b.Take(schemas.PriorityLow, 200); ok {
		t.Fatal("600 low tokens admitted past the threshold: low's share is 100 and nothing is common")
	}
	first.Settle(50)
	second, ok := b.Take(schemas.PriorityLow, 200)
	if !ok {
		t.Fatal("200 low tokens refused after the 400 estimate settled at 50 (250 of 500 used)")
	}
	second.Settle(440) // 50 + 440 = 490
	if _, ok := a.Take(schemas.PriorityLow, 20); ok {
		t.Fatal("low admitted at 510 tokens past the threshold after a call settled above its estimate")
	}
	third, ok := a.Take(schemas.PriorityLow, 5)
	if !ok {
		t.Fatal("5 low tokens refused at 490 of 500")
	}
	third.Settle(0) // refused further on: nothing spent
	if _, ok := b.Take(schemas.PriorityLow, 10); !ok {
		t.Fatal("10 low tokens refused at 490 of 500 once a 5-token hold settled at zero")
	}
	if a.RedisErrors()+b.RedisErrors() != 0 {
		t.Errorf("Redis errors: %d, %d", a.RedisErrors(), b.RedisErrors())
	}
}

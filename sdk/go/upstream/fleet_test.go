package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/internal/manualclock"
)

// fleetPair returns two gateway processes' breakers of one upstream,
// sharing its state in the real Redis, on one manual clock. Each has its
// own Fleet on its own Redis client, as two processes would: nothing but
// Redis connects them.
func fleetPair(t *testing.T) (*manualclock.Clock, *Breaker, *Breaker) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Redis")
	}
	cfg := itest.Redis(t)
	prefix := itest.Unique(t, "sluice:test:")
	t.Cleanup(func() {
		rdb := redisconn.NewClient(cfg)
		defer rdb.Close()
		for _, k := range rdb.Keys(context.Background(), prefix+"*").Val() {
			rdb.Del(context.Background(), k)
		}
	})
	clock := manualclock.New(t0)
	mk := func() *Breaker {
		rdb := redisconn.NewClient(cfg)
		t.Cleanup(func() { rdb.Close() })
		f, err := NewFleet(rdb, prefix, "acct-1", 0)
		if err != nil {
			t.Fatal(err)
		}
		return newBreaker(t, clock, FleetWide(f, 0), OnFleetError(func(err error) { t.Errorf("fleet error: %v", err) }))
	}
	return clock, mk(), mk()
}

func probes(t *testing.T, b *Breaker, n int) {
	t.Helper()
	for i := range n {
		if p, ok, _ := b.Allow(); !ok || !p {
			t.Fatalf("probe %d of %d refused", i+1, n)
		}
	}
}

func wantState(t *testing.T, b *Breaker, st State, openFor time.Duration) {
	t.Helper()
	if s := b.Stats(); s.State != st || s.OpenFor != openFor {
		t.Fatalf("breaker %+v, want %s with open time %v", s, st, openFor)
	}
}

// TestFleetBreakerCountsProbesAcrossGateways: nine consecutive failures
// in gateway A leave the upstream's breaker closed; the tenth (the
// default ConsecutiveFailures) opens it for the fleet; gateway B, which saw none, follows. After the open time the fleet sends 5 probes in
// all, whichever gateway sends them; one failed probe reopens both for
// twice as long, twice in a row (30 s, 60 s, 120 s); 5 successful probes
// from both gateways close it for both and reset the open time.
func TestFleetBreakerCountsProbesAcrossGateways(t *testing.T) {
	clock, a, b := fleetPair(t)
	for range 9 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	b.sync()
	wantState(t, a, Closed, 30*time.Second)
	wantState(t, b, Closed, 30*time.Second)
	call(a, time.Millisecond, concurrency.Failure) // the 10th in a row
	wantState(t, a, Open, 30*time.Second)
	b.sync()
	wantState(t, b, Open, 30*time.Second)
	if _, ok, retry := b.Allow(); ok || retry != 30*time.Second {
		t.Fatalf("gateway B: allowed %v, retry %v; want refused for 30s", ok, retry)
	}

	for _, want := range []time.Duration{60 * time.Second, 120 * time.Second} {
		clock.Advance(b.Stats().OpenFor)
		probes(t, a, 3)
		probes(t, b, 2)
		for _, g := range []*Breaker{a, b} {
			if p, ok, _ := g.Allow(); ok || p {
				t.Fatal("a sixth probe was handed out: probes are not counted fleet-wide")
			}
		}
		b.Record(true, time.Millisecond, concurrency.Failure) // one probe fails
		wantState(t, b, Open, want)
		a.Record(true, time.Millisecond, concurrency.Success) // a success of the round that failed counts for nothing
		wantState(t, a, Open, want)
	}

	clock.Advance(120 * time.Second)
	probes(t, a, 3)
	probes(t, b, 2)
	for range 3 {
		a.Record(true, time.Millisecond, concurrency.Success)
	}
	b.Record(true, time.Millisecond, concurrency.Success)
	wantState(t, b, HalfOpen, 120*time.Second)
	b.Record(true, time.Millisecond, concurrency.Success)
	wantState(t, b, Closed, 30*time.Second)
	a.sync()
	wantState(t, a, Closed, 30*time.Second)
	if p, ok, _ := a.Allow(); !ok || p {
		t.Fatal("gateway A does not pass calls after the fleet closed")
	}
}

// TestFleetBreakerWorksAloneWithoutRedis: with Redis unreachable the
// breaker still opens, probes and closes on its own, and counts the
// failed Redis calls.
func TestFleetBreakerWorksAloneWithoutRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	f, err := NewFleet(rdb, "p:", "u", 0)
	if err != nil {
		t.Fatal(err)
	}
	clock := manualclock.New(t0)
	b := newBreaker(t, clock, FleetWide(f, 0))
	for range 10 {
		call(b, time.Millisecond, concurrency.Failure)
	}
	wantState(t, b, Open, 30*time.Second)
	clock.Advance(30 * time.Second)
	probes(t, b, 5)
	for range 5 {
		b.Record(true, time.Millisecond, concurrency.Success)
	}
	wantState(t, b, Closed, 30*time.Second)
	if b.Stats().FleetErrors == 0 {
		t.Fatal("failed Redis calls were not counted")
	}
}

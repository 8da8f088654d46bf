package concurrency

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
)

const within = 10 * time.Second

// sharedPair returns two gates, two gateway processes sharing one
// upstream's count in the real Redis under a unique prefix.
func sharedPair(t *testing.T, limit int, opts ...SharedOpt) (redis.UniversalClient, *Shared, *Shared) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rdb, prefix := itest.ScratchRedis(t)
	// The tests check the shared count, not latency: a parallel `make
	// test` on two cores can take a Redis call past the 100 ms default
	// and refuse a slot the count has.
	opts = append([]SharedOpt{RedisTimeout(5 * time.Second)}, opts...)
	mk := func(id string) *Shared {
		s, err := NewShared(rdb, prefix, "acct-1", id, Fixed(limit), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return rdb, mk("gw-a"), mk("gw-b")
}

func take(t *testing.T, s *Shared, n int) {
	t.Helper()
	for i := range n {
		if !s.TryAcquire() {
			t.Fatalf("slot %d of %d refused", i+1, n)
		}
	}
}

// TestSharedCountsAcrossGateways: two gateways share a limit of 3: once
// they hold 3 between them both are refused, and a slot released by one
// can be taken by the other.
func TestSharedCountsAcrossGateways(t *testing.T) {
	_, a, b := sharedPair(t, 3)
	take(t, a, 2)
	take(t, b, 1)
	if a.TryAcquire() || b.TryAcquire() {
		t.Fatal("a fourth slot was granted against a shared limit of 3")
	}
	if a.InFlight() != 3 || b.InFlight() != 3 {
		t.Fatalf("fleet counts seen: a %d, b %d", a.InFlight(), b.InFlight())
	}
	a.Release(time.Millisecond, Success)
	take(t, b, 1)
	if a.TryAcquire() {
		t.Fatal("granted past the limit after the other gateway took the freed slot")
	}
	if a.RedisErrors() != 0 || b.RedisErrors() != 0 {
		t.Fatalf("redis errors: %d, %d", a.RedisErrors(), b.RedisErrors())
	}
}

// TestSharedDeadGatewaysSlotsComeBack: a gateway that holds every slot
// and dies (no Run renews its lease, no release) blocks the other only
// until its lease expires.
func TestSharedDeadGatewaysSlotsComeBack(t *testing.T) {
	_, a, b := sharedPair(t, 2, LeaseTime(300*time.Millisecond))
	take(t, a, 2) // a "dies" holding both
	if b.TryAcquire() {
		t.Fatal("granted while the other gateway's lease holds every slot")
	}
	itest.Eventually(t, within, "the dead gateway's slots to come back", func() bool { return b.TryAcquire() })
	take(t, b, 1)
	if b.Local() != 2 {
		t.Fatalf("b holds %d, want 2", b.Local())
	}
}

// TestSharedRunKeepsTheLeaseAndFreesOnShutdown: a live gateway's Run
// renews its lease past the lease time, so its slots stay counted; when
// its Run ends (clean shutdown) they are freed at once.
func TestSharedRunKeepsTheLeaseAndFreesOnShutdown(t *testing.T) {
	rdb, a, b := sharedPair(t, 2, LeaseTime(300*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	take(t, a, 2)
	first := rdb.ZScore(context.Background(), a.leasesKey, "gw-a").Val()
	// Two renewals later the lease reaches past the first one's expiry.
	itest.Eventually(t, within, "the lease to be renewed past its first expiry", func() bool {
		return rdb.ZScore(context.Background(), a.leasesKey, "gw-a").Val() > first+300
	})
	if b.TryAcquire() {
		t.Fatal("the live gateway's slots were dropped")
	}
	cancel()
	wg.Wait()
	take(t, b, 2)
}

// TestSharedFailsOpenWithoutRedis: with Redis unreachable a gateway
// counts its own calls against the limit and reports the errors.
func TestSharedFailsOpenWithoutRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	var errs []error
	s, err := NewShared(rdb, "p:", "u", "gw", Fixed(2), OnRedisError(func(e error) { errs = append(errs, e) }))
	if err != nil {
		t.Fatal(err)
	}
	take(t, s, 2)
	if s.TryAcquire() {
		t.Fatal("granted a third slot of 2 without Redis")
	}
	s.Release(time.Millisecond, Success)
	take(t, s, 1)
	if s.RedisErrors() != 4 || len(errs) != 4 {
		t.Fatalf("%d errors counted, %d reported; want 4 acquires", s.RedisErrors(), len(errs))
	}
}

// TestSharedRenewRacingAReleaseRestoresNoPhantomSlot: Run's renewal reads
// how many slots this process holds, and a release that drives the count
// to zero lands before the renewal's script runs (the hook plays that
// interleaving). The renewal must not restore the slot that was just
// released: the other gateway gets every slot.
func TestSharedRenewRacingAReleaseRestoresNoPhantomSlot(t *testing.T) {
	rdb, a, b := sharedPair(t, 2)
	take(t, a, 1)
	a.beforeRenew = func() { a.Release(time.Millisecond, Success) }
	a.renew(context.Background())
	if n, err := rdb.HGet(context.Background(), a.countsKey, "gw-a").Int(); err != redis.Nil {
		t.Fatalf("gw-a's count in Redis after its only slot was released: %d (%v), want none", n, err)
	}
	take(t, b, 2)
	if a.Local() != 0 {
		t.Fatalf("a holds %d", a.Local())
	}
}

// TestSharedRenewRestoresADroppedCount: a process whose lease lapsed (a
// long pause) had its count dropped by another's acquire; its next renewal
// counts its slots again.
func TestSharedRenewRestoresADroppedCount(t *testing.T) {
	rdb, a, b := sharedPair(t, 3)
	take(t, a, 2)
	a.Release(time.Millisecond, Success)
	take(t, a, 1)
	ctx := context.Background()
	// What another process's acquire does to a lapsed lease.
	rdb.HDel(ctx, a.countsKey, "gw-a")
	rdb.ZRem(ctx, a.leasesKey, "gw-a")
	rdb.HDel(ctx, a.releasedKey, "gw-a")
	a.renew(ctx)
	if n, err := rdb.HGet(ctx, a.countsKey, "gw-a").Int(); err != nil || n != 2 {
		t.Fatalf("gw-a's count after the renewal: %d (%v), want its 2 slots", n, err)
	}
	take(t, b, 1)
	if b.TryAcquire() {
		t.Fatal("granted a fourth slot of 3")
	}
}

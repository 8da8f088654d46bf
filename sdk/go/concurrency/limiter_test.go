package concurrency

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLimiterNeverExceedsItsLimit: many goroutines racing for slots never
// hold more than the limit at once.
func TestLimiterNeverExceedsItsLimit(t *testing.T) {
	l := NewLimiter(Fixed(7))
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 2000 {
				if !l.TryAcquire() {
					continue
				}
				n := held.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				held.Add(-1)
				l.Release(time.Millisecond, Success)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > 7 || p < 1 {
		t.Fatalf("peak concurrent holders = %d, want 1..7", p)
	}
	if l.InFlight() != 0 {
		t.Fatalf("InFlight = %d after every slot was released", l.InFlight())
	}
}

// TestLimiterFollowsItsAlgorithm: releases feed the algorithm with the
// limiter's clock; a lower limit refuses until enough calls finish, and
// OnChange reports each change.
func TestLimiterFollowsItsAlgorithm(t *testing.T) {
	th, err := NewThreshold(InitialLimit(5), MinLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	var changes [][2]int
	l := NewLimiter(th, Clock(func() time.Time { return now }), OnChange(func(o, n int) { changes = append(changes, [2]int{o, n}) }))
	for range 5 {
		if !l.TryAcquire() {
			t.Fatal("refused under the initial limit of 5")
		}
	}
	if l.TryAcquire() {
		t.Fatal("a sixth slot was granted with limit 5")
	}
	l.Release(3*time.Second, Success) // starts the 10 s interval
	now = now.Add(10 * time.Second)
	l.Release(3*time.Second, Success) // the interval ended slow: 5 × 0.8 = 4
	if l.Limit() != 4 || len(changes) != 1 || changes[0] != [2]int{5, 4} {
		t.Fatalf("limit %d, changes %v; want 4 and one change 5→4", l.Limit(), changes)
	}
	if l.InFlight() != 3 {
		t.Fatalf("in flight %d, want 3", l.InFlight())
	}
	first := l.TryAcquire()
	second := l.TryAcquire()
	if !first || second {
		t.Fatalf("with 3 in flight and limit 4 exactly one more slot must be granted: %v, %v", first, second)
	}
	l.Release(0, Ignored)
	if l.InFlight() != 3 || len(changes) != 1 {
		t.Fatal("an ignored outcome must free the slot and leave the algorithm alone")
	}
}

func TestKeyedCountsPerKeyAndForgetsIdleKeys(t *testing.T) {
	k := NewKeyed()
	var got []bool
	for range 3 {
		got = append(got, k.TryAcquire("a", 2))
	}
	if !slices.Equal(got, []bool{true, true, false}) {
		t.Fatalf("key a with limit 2: %v, want two slots then a refusal", got)
	}
	if !k.TryAcquire("b", 2) {
		t.Fatal("key b is limited by key a's slots")
	}
	if k.TryAcquire("c", 0) {
		t.Fatal("a limit of 0 must refuse")
	}
	k.Release("a")
	if !k.TryAcquire("a", 2) {
		t.Fatal("a released slot was not reusable")
	}
	k.Release("a")
	k.Release("a")
	k.Release("b")
	k.Release("zzz")
	if k.Keys() != 0 || k.InFlight("a") != 0 {
		t.Fatalf("%d keys still held after every release", k.Keys())
	}
}

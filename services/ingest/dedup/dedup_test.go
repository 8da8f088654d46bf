package dedup

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock               { return &clock{t: time.Unix(1_700_000_000, 0)} }

func expect(t *testing.T, got, want State) {
	t.Helper()
	if got != want {
		t.Fatalf("state = %d, want %d", got, want)
	}
}

func begin(t *testing.T, w *Window, id string, owner uint64, want State) Key {
	t.Helper()
	return beginKey(t, w, Key{Tenant: "acme", ID: id}, owner, want)
}

func beginKey(t *testing.T, w *Window, id Key, owner uint64, want State) Key {
	t.Helper()
	got, key := w.Begin(id, owner)
	expect(t, got, want)
	if want == Claimed && key != id {
		t.Fatalf("key %+v, want a copy of %+v", key, id)
	}
	return key
}

func TestMarkOnlyAfterCommit(t *testing.T) {
	w := NewWindow(time.Minute, 1000, newClock().now)
	k := begin(t, w, "a", 1, Claimed)
	// While the first request is producing, a retry must not be acknowledged.
	begin(t, w, "a", 2, InFlight)
	begin(t, w, "a", 1, SameOwner)
	w.Commit(k, 1)
	begin(t, w, "a", 3, Acknowledged)
}

func TestAbortLeavesNoMark(t *testing.T) {
	w := NewWindow(time.Minute, 1000, newClock().now)
	k := begin(t, w, "a", 1, Claimed)
	w.Abort(k, 1)
	k2 := begin(t, w, "a", 2, Claimed)
	// A stale owner's abort or commit must not touch the current claim.
	w.Abort(k, 1)
	w.Commit(k, 1)
	begin(t, w, "a", 3, InFlight)
	w.Commit(k2, 2)
	begin(t, w, "a", 3, Acknowledged)
}

func TestMarksExpireAfterWindow(t *testing.T) {
	c := newClock()
	w := NewWindow(time.Minute, 1000, c.now)
	w.Commit(begin(t, w, "a", 1, Claimed), 1)
	c.add(59 * time.Second)
	begin(t, w, "a", 2, Acknowledged)
	c.add(2 * time.Second)
	k := begin(t, w, "a", 2, Claimed)
	// The old mark's eviction must not drop the new claim.
	for i := range 5000 {
		id := fmt.Sprint("x-", i)
		w.Commit(begin(t, w, id, 9, Claimed), 9)
	}
	begin(t, w, "a", 3, InFlight)
	w.Commit(k, 2)
	begin(t, w, "a", 3, Acknowledged)
}

func TestBoundedCountEvictsOldest(t *testing.T) {
	c := newClock()
	w := NewWindow(time.Hour, 64, c.now) // 2 marks per shard
	for i := range 10_000 {
		id := fmt.Sprint("id-", i)
		w.Commit(begin(t, w, id, 1, Claimed), 1)
		c.add(time.Millisecond)
	}
	if n := w.Len(); n > 64 {
		t.Fatalf("window holds %d marks, more than its bound 64", n)
	}
	// The newest is still there, the oldest is gone.
	begin(t, w, "id-9999", 2, Acknowledged)
	begin(t, w, "id-0", 2, Claimed)
}

func TestConcurrentClaimsOneWinner(t *testing.T) {
	w := NewWindow(time.Minute, 1000, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for o := uint64(1); o <= 16; o++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s, _ := w.Begin(Key{Tenant: "acme", ID: "same"}, o); s == Claimed {
				mu.Lock()
				winners++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if winners != 1 {
		t.Fatalf("%d owners claimed the same id, want exactly 1", winners)
	}
}

// TestKeyIsTenantIDAndEstimated: a settlement (same id, estimated false)
// is not a duplicate of its estimate, and another tenant's event with the
// same id is not either; a repeat of either one is.
func TestKeyIsTenantIDAndEstimated(t *testing.T) {
	w := NewWindow(time.Minute, 1000, newClock().now)
	est := Key{Tenant: "acme", ID: "req-1", Estimated: true}
	w.Commit(beginKey(t, w, est, 1, Claimed), 1)
	settle := Key{Tenant: "acme", ID: "req-1"}
	w.Commit(beginKey(t, w, settle, 2, Claimed), 2)
	other := Key{Tenant: "globex", ID: "req-1"}
	w.Commit(beginKey(t, w, other, 3, Claimed), 3)
	beginKey(t, w, est, 4, Acknowledged)
	beginKey(t, w, settle, 4, Acknowledged)
	beginKey(t, w, other, 4, Acknowledged)
}

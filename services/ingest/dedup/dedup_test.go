package dedup

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
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

func begin(t *testing.T, w *Window, id string, owner uint64, want State) Mark {
	t.Helper()
	return beginKey(t, w, Key{Tenant: "acme", ID: id}, owner, want)
}

func beginKey(t *testing.T, w *Window, id Key, owner uint64, want State) Mark {
	t.Helper()
	got, mark := w.Begin(id, owner)
	expect(t, got, want)
	if want == Claimed && mark != w.mark(id) {
		t.Fatalf("mark %+v, want the window's mark of %+v", mark, id)
	}
	return mark
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
	// Where tenant ends and id begins is part of the key.
	w.Commit(beginKey(t, w, Key{Tenant: "ab", ID: "c"}, 5, Claimed), 5)
	beginKey(t, w, Key{Tenant: "a", ID: "bc"}, 6, Claimed)
}

// The window keeps no reference to the caller's strings: a request's
// buffer reused for the next request cannot change what was remembered.
func TestWindowKeepsNoReferenceToIDs(t *testing.T) {
	w := NewWindow(time.Minute, 1000, newClock().now)
	buf := []byte("req-1")
	id := Key{Tenant: "acme", ID: unsafe.String(&buf[0], len(buf))}
	w.Commit(beginKey(t, w, id, 1, Claimed), 1)
	copy(buf, "req-2")
	beginKey(t, w, Key{Tenant: "acme", ID: "req-1"}, 2, Acknowledged)
	beginKey(t, w, Key{Tenant: "acme", ID: "req-2"}, 2, Claimed)
}

// Ids of the longest length the schema allows, and longer, are marked and
// found like short ones.
func TestLongIDs(t *testing.T) {
	w := NewWindow(time.Minute, 1000, newClock().now)
	for _, n := range []int{128, 300, 70_000} {
		id := Key{Tenant: strings.Repeat("t", 64), ID: strings.Repeat("i", n)}
		w.Commit(beginKey(t, w, id, 1, Claimed), 1)
		beginKey(t, w, id, 2, Acknowledged)
		other := id
		other.ID = other.ID[:n-1] + "j"
		beginKey(t, w, other, 2, Claimed)
	}
}

// BenchmarkBeginCommit claims and acknowledges distinct ids in a full
// window of 500,000 (ingest's default), as one-event requests do: one
// Begin and one Commit per event, in parallel.
func BenchmarkBeginCommit(b *testing.B) {
	const full = 500_000
	w := NewWindow(time.Hour, full, nil)
	for i := range full {
		_, k := w.Begin(Key{Tenant: fmt.Sprintf("tenant-%d", i%1000), ID: fmt.Sprintf("%036d", i)}, 1)
		w.Commit(k, 1)
	}
	var owners atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		owner := owners.Add(1) + 1
		// A fresh 36-byte id per event, written in place: Begin keeps no
		// reference to the caller's strings.
		buf := []byte(fmt.Sprintf("g%02d-%032d", owner, 0))
		for i := 0; pb.Next(); i++ {
			for j, v := len(buf)-1, i; v > 0; j, v = j-1, v/10 {
				buf[j] = byte('0' + v%10)
			}
			id := Key{Tenant: tenants[i%len(tenants)], ID: unsafe.String(&buf[0], len(buf))}
			if state, k := w.Begin(id, owner); state == Claimed {
				w.Commit(k, owner)
			}
		}
	})
}

var tenants = func() []string {
	t := make([]string, 1000)
	for i := range t {
		t[i] = fmt.Sprintf("tenant-%d", i)
	}
	return t
}()

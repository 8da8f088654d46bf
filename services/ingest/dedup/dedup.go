// Package dedup remembers which usage events the broker has acknowledged
// recently, so that ingest can acknowledge a gateway's retry without
// producing the event a second time, and which ids are being produced right
// now, so that a retry racing its original is neither produced twice nor
// acknowledged before the original was.
//
// An event is known by its [Key]: tenant, id and whether it is an estimate.
// The bare id is not enough: a settlement reuses its estimate's id with
// estimated false and must be produced, and one tenant's gateway must not be
// able to suppress another tenant's event by sending its id first.
//
// A key moves through two states. Begin claims it as pending for one owner
// (one HTTP request); Commit turns the claim into an acknowledged mark once
// the broker acknowledged the event; Abort drops the claim when the produce
// failed, so the gateway's retry is produced again and counted exactly once.
// A mark is never written before the broker's acknowledgement.
//
// Memory is bounded. Acknowledged marks live at most Window and at most
// MaxIDs of them are kept: when full, the oldest mark is evicted first (all
// marks share one lifetime, so the oldest is also the first to expire).
// Pending claims are not counted against MaxIDs; the caller bounds them with
// its in-flight budget. The window is the first line of deduplication, not
// the only one: an id evicted early is caught by the aggregator.
//
// Begin and Commit run for every event ingest accepts, so the window is
// hand-written (sharded locks, one map lookup per call, the eviction ring
// of package fifo) rather than a library LRU; BenchmarkIngest1,
// BenchmarkIngest100 and BenchmarkIngest1000 in services/ingest measure
// it as part of the request path (see bench/README.md).
package dedup

import (
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/services/internal/fifo"
)

// State is what Begin found for an id.
type State uint8

const (
	// Claimed means the id was unknown and is now pending for the caller, who
	// must call Commit or Abort.
	Claimed State = iota
	// Acknowledged means the broker already acknowledged an event with this
	// id inside the window: acknowledge it again and do not produce it.
	Acknowledged
	// SameOwner means the caller itself claimed this id earlier (the id
	// appears twice in one request): produce it once.
	SameOwner
	// InFlight means another owner is producing this id right now; its
	// outcome is unknown, so ask the client to retry later.
	InFlight
)

// shards spreads the lock; a power of two so the hash selects by mask.
const shards = 32

// Window is safe for concurrent use.
type Window struct {
	ttl    time.Duration
	now    func() time.Time
	seed   maphash.Seed
	shards [shards]shard
}

type shard struct {
	mu sync.Mutex
	// ids maps each known key to its state: pending for an owner, or
	// acknowledged until an expiry. One map keeps Begin and Commit at one
	// lookup each.
	ids map[Key]slot
	// ring holds acknowledged ids in insertion order, which is expiry
	// order, oldest first. Its capacity is the shard's share of MaxIDs.
	ring *fifo.Ring[ringEntry]
}

// slot is pending when owner is non-zero, else acknowledged until expiry
// (unix nanoseconds).
type slot struct {
	owner  uint64
	expiry int64
}

type ringEntry struct {
	id     Key
	expiry int64
}

// Key identifies one event for deduplication: the same id sent by another
// tenant, or as the settlement of an estimate, is a different event.
type Key struct {
	Tenant    string
	ID        string
	Estimated bool
}

// NewWindow returns a window that keeps acknowledged ids for ttl, at most
// maxIDs of them. now may be nil (time.Now); tests pass a fake clock.
func NewWindow(ttl time.Duration, maxIDs int, now func() time.Time) *Window {
	if now == nil {
		now = time.Now
	}
	per := max(maxIDs/shards, 1)
	w := &Window{ttl: ttl, now: now, seed: maphash.MakeSeed()}
	for i := range w.shards {
		w.shards[i] = shard{ids: make(map[Key]slot), ring: fifo.New[ringEntry](per)}
	}
	return w
}

func (w *Window) shard(k Key) *shard {
	// The id alone spreads keys well; an estimate and its settlement, or
	// two tenants' equal ids, sharing a shard costs nothing.
	return &w.shards[maphash.String(w.seed, k.ID)&(shards-1)]
}

// Begin looks id up and, if it is neither acknowledged nor pending, claims it
// for owner. owner must be non-zero and unique per concurrent caller. When
// the state is Claimed, key is the window's own copy of id: pass it to
// Commit or Abort, so the window stores one copy, which never pins the
// request body the caller's strings may point into.
func (w *Window) Begin(id Key, owner uint64) (state State, key Key) {
	s := w.shard(id)
	now := w.now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.ids[id]; ok {
		switch {
		case v.owner == owner:
			return SameOwner, Key{}
		case v.owner != 0:
			return InFlight, Key{}
		case v.expiry > now:
			return Acknowledged, Key{}
		}
	}
	// One copy of both strings: one allocation per claimed event (a
	// Builder always copies, where a concatenation with an empty string
	// would return the caller's).
	var sb strings.Builder
	sb.Grow(len(id.Tenant) + len(id.ID))
	sb.WriteString(id.Tenant)
	sb.WriteString(id.ID)
	both := sb.String()
	key = Key{Tenant: both[:len(id.Tenant)], ID: both[len(id.Tenant):], Estimated: id.Estimated}
	s.ids[key] = slot{owner: owner}
	return Claimed, key
}

// Commit records that the broker acknowledged key (from Begin) and releases
// owner's claim.
func (w *Window) Commit(key Key, owner uint64) {
	s := w.shard(key)
	now := w.now()
	exp := now.Add(w.ttl).UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.ids[key]; !ok || v.owner != owner {
		return // not ours (an id committed by another owner meanwhile)
	}
	s.expire(now.UnixNano())
	// Push before the map write: when the ring is full the oldest mark
	// goes first, as the bound promises.
	if old, evicted := s.ring.Push(ringEntry{id: key, expiry: exp}); evicted {
		s.forget(old)
	}
	s.ids[key] = slot{expiry: exp}
}

// Abort releases owner's claim on key without a mark, so the next attempt
// is produced.
func (w *Window) Abort(key Key, owner uint64) {
	s := w.shard(key)
	s.mu.Lock()
	if v, ok := s.ids[key]; ok && v.owner == owner {
		delete(s.ids, key)
	}
	s.mu.Unlock()
}

// Len returns the number of acknowledged marks held, expired ones that were
// not yet swept included.
func (w *Window) Len() int {
	n := 0
	for i := range w.shards {
		s := &w.shards[i]
		s.mu.Lock()
		n += s.ring.Len()
		s.mu.Unlock()
	}
	return n
}

// expire drops marks whose time is up from the front of the ring.
func (s *shard) expire(now int64) {
	for {
		e, ok := s.ring.Front()
		if !ok || e.expiry > now {
			return
		}
		s.ring.Pop()
		s.forget(e)
	}
}

// forget removes the mark e left the ring with from the map.
func (s *shard) forget(e ringEntry) {
	// The id may have been claimed again since (its mark had expired) or
	// re-acknowledged with a newer expiry; only a matching mark goes.
	if v, ok := s.ids[e.id]; ok && v.owner == 0 && v.expiry == e.expiry {
		delete(s.ids, e.id)
	}
}

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
// The window stores a [Mark] for each key, not the key: 128 bits of two
// hashes of tenant, id and estimated under seeds drawn at start. So a mark
// costs about 110 bytes whatever the ids' length (230 with 36-byte ids
// when the window kept the strings), holds no
// pointer for the garbage collector to scan, and is found without
// comparing strings in memory far from the map. Two different keys share
// a mark with probability 2^-128 per pair; a shared mark would answer a
// new event as a duplicate, and at 500,000 marks the chance that any of
// 10^15 events does is about 10^-18. The seeds are not known outside the
// process, so nobody can pick an id whose mark is another tenant's.
//
// Begin and Commit run for every event ingest accepts, so the window is
// hand-written (sharded locks, one map lookup per call, the eviction ring
// of package fifo) rather than a library LRU; BenchmarkBeginCommit, and
// BenchmarkIngest1, BenchmarkIngest100 and BenchmarkIngest1000 in
// services/ingest as part of the request path, measure it (see
// bench/README.md).
package dedup

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/fifo"
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
	seeds  [2]maphash.Seed
	shards [shards]shard
}

type shard struct {
	mu sync.Mutex
	// ids maps each known key's mark to its state: pending for an owner,
	// or acknowledged until an expiry. One map keeps Begin and Commit at
	// one lookup each.
	ids map[Mark]slot
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
	mark   Mark
	expiry int64
}

// Key identifies one event for deduplication: the same id sent by another
// tenant, or as the settlement of an estimate, is a different event.
type Key struct {
	Tenant    string
	ID        string
	Estimated bool
}

// Mark is what the window remembers of a [Key]: see the package
// documentation. Begin returns it for Commit and Abort.
type Mark struct{ hi, lo uint64 }

// markBufSize holds the longest tenant and id the schema allows (64 and
// 128 bytes) with their lengths, so that marking needs no allocation.
const markBufSize = 256

// mark hashes k's fields after their lengths, so that tenant "ab" with id
// "c" and tenant "a" with id "bc" differ.
func (w *Window) mark(k Key) Mark {
	var stack [markBufSize]byte
	b := stack[:0]
	b = binary.AppendUvarint(b, uint64(len(k.Tenant)))
	b = binary.AppendUvarint(b, uint64(len(k.ID)))
	if k.Estimated {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = append(b, k.Tenant...)
	b = append(b, k.ID...)
	return Mark{hi: maphash.Bytes(w.seeds[0], b), lo: maphash.Bytes(w.seeds[1], b)}
}

// NewWindow returns a window that keeps acknowledged ids for ttl, at most
// maxIDs of them. now may be nil (time.Now); tests pass a fake clock.
func NewWindow(ttl time.Duration, maxIDs int, now func() time.Time) *Window {
	if now == nil {
		now = time.Now
	}
	per := max(maxIDs/shards, 1)
	w := &Window{ttl: ttl, now: now, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	for i := range w.shards {
		w.shards[i] = shard{ids: make(map[Mark]slot), ring: fifo.New[ringEntry](per)}
	}
	return w
}

func (w *Window) shard(m Mark) *shard { return &w.shards[m.lo&(shards-1)] }

// Begin looks id up and, if it is neither acknowledged nor pending, claims it
// for owner. owner must be non-zero and unique per concurrent caller. When
// the state is Claimed, pass mark to Commit or Abort. The window keeps no
// reference to id's strings.
func (w *Window) Begin(id Key, owner uint64) (state State, mark Mark) {
	mark = w.mark(id)
	s := w.shard(mark)
	now := w.now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.ids[mark]; ok {
		switch {
		case v.owner == owner:
			return SameOwner, Mark{}
		case v.owner != 0:
			return InFlight, Mark{}
		case v.expiry > now:
			return Acknowledged, Mark{}
		}
	}
	s.ids[mark] = slot{owner: owner}
	return Claimed, mark
}

// Commit records that the broker acknowledged the event of mark (from
// Begin) and releases owner's claim.
func (w *Window) Commit(mark Mark, owner uint64) {
	s := w.shard(mark)
	now := w.now()
	exp := now.Add(w.ttl).UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.ids[mark]; !ok || v.owner != owner {
		return // not ours (an id committed by another owner meanwhile)
	}
	s.expire(now.UnixNano())
	// Push before the map write: when the ring is full the oldest mark
	// goes first, as the bound promises.
	if old, evicted := s.ring.Push(ringEntry{mark: mark, expiry: exp}); evicted {
		s.forget(old)
	}
	s.ids[mark] = slot{expiry: exp}
}

// Abort releases owner's claim on mark without acknowledging it, so the
// next attempt is produced.
func (w *Window) Abort(mark Mark, owner uint64) {
	s := w.shard(mark)
	s.mu.Lock()
	if v, ok := s.ids[mark]; ok && v.owner == owner {
		delete(s.ids, mark)
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
	if v, ok := s.ids[e.mark]; ok && v.owner == 0 && v.expiry == e.expiry {
		delete(s.ids, e.mark)
	}
}

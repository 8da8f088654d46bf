// Package fifo is a bounded first-in-first-out ring (and Set, a bounded
// seen-ids memory built on it, used by the enforcer and the alerter to skip
// replayed signals): the one memory bound
// shared by the two places Sluice remembers recent event ids, ingest's
// dedup window (services/ingest/dedup, ids acknowledged by the broker) and
// the aggregator's per-partition id memory (services/aggregator's tally,
// ids counted). Both evict their oldest id first when full, and the
// dedup window also drops expired ids from the front.
//
// A library LRU (hashicorp/golang-lru's expirable LRU, for one) would
// replace the ring and the map around it but not fit either hot path: it
// allocates a list element per id, moves entries on every hit, and keeps a
// pointer-rich structure the garbage collector must scan, where the tally
// keeps its id map pointer-free on purpose. So the rings stay hand-written,
// here once; the maps beside them stay with their owners, whose keys and
// values differ.
//
// The ring grows by doubling up to its capacity, so a partition or shard
// that sees few ids never pays for the full bound.
package fifo

import "iter"

// Ring holds at most Cap values, oldest first. It is not safe for
// concurrent use; its owners hold their own locks.
type Ring[T any] struct {
	buf        []T
	head, size int
	capacity   int
}

// initial is the first allocation of a ring that receives values.
const initial = 64

// New returns an empty ring that holds at most capacity values (at least
// one).
func New[T any](capacity int) *Ring[T] {
	return &Ring[T]{capacity: max(capacity, 1)}
}

// Len returns how many values the ring holds.
func (r *Ring[T]) Len() int { return r.size }

// Cap returns the most values the ring holds.
func (r *Ring[T]) Cap() int { return r.capacity }

// Push appends v as the newest value. When the ring was full it first
// removes the oldest value and returns it with evicted true, so the owner
// can forget it too.
func (r *Ring[T]) Push(v T) (oldest T, evicted bool) {
	if r.size == r.capacity {
		oldest, evicted = r.Pop()
	} else if r.size == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
	return oldest, evicted
}

// Front returns the oldest value; ok is false when the ring is empty.
func (r *Ring[T]) Front() (v T, ok bool) {
	if r.size == 0 {
		return v, false
	}
	return r.buf[r.head], true
}

// Pop removes and returns the oldest value; ok is false when the ring is
// empty. The slot is zeroed so the ring does not keep what it dropped
// reachable.
func (r *Ring[T]) Pop() (v T, ok bool) {
	if r.size == 0 {
		return v, false
	}
	var zero T
	v, r.buf[r.head] = r.buf[r.head], zero
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return v, true
}

// grow doubles the buffer (up to the capacity), oldest value first.
func (r *Ring[T]) grow() {
	n := min(max(2*len(r.buf), initial), r.capacity)
	buf := make([]T, n)
	for i := 0; i < r.size; i++ {
		buf[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head = buf, 0
}

// All returns the values oldest first, for a snapshot of the owner's
// state; the ring must not change while the sequence runs.
func (r *Ring[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for i := range r.size {
			if !yield(r.buf[(r.head+i)%len(r.buf)]) {
				return
			}
		}
	}
}

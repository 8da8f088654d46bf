package checker

import (
	"math/bits"
	"sync/atomic"
)

// This file holds the in-memory index Check reads: a hash of the tenant name
// and one flat open-addressing table per shard. The design follows from the
// numbers: with 100,000 tenants the index does not fit in the CPU caches, so
// what a Check costs is the cache lines it touches, and most Checks are for
// tenants without any flag. A negative lookup therefore decides on a byte
// array (one fingerprint per slot, 2 to 4 bytes per flagged tenant, small
// enough to stay cached) and stops at the first empty byte; only a matching
// fingerprint leads to the view itself.

// Hash constants (odd, well-mixed 64-bit values, as in the wyhash family).
const (
	hashP0 = 0xa0761d6478bd642f
	hashP1 = 0xe7037ed1a0b428db
	hashP2 = 0x8ebc6af09c88c6e3
)

// mix folds the 128-bit product of a and b into 64 bits: one multiply does
// the avalanche work that byte-at-a-time hashes spend a multiply per byte on.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// le64 reads 8 bytes of s at i, little-endian; the compiler merges the byte
// loads into one.
func le64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string, i int) uint64 {
	s = s[i : i+4]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

// tenantHash is a 64-bit hash of s under seed, reading 16 bytes per round.
// It is not cryptographic; the per-Checker random seed keeps table layouts
// from being predictable across processes.
func tenantHash(s string, seed uint64) uint64 {
	n := len(s)
	h := seed ^ mix(seed^hashP0, uint64(n)^hashP1)
	for len(s) > 16 {
		h = mix(le64(s, 0)^hashP1, le64(s, 8)^h)
		s = s[16:]
	}
	// The last 0..16 bytes, read as two (possibly overlapping) words.
	var a, b uint64
	switch m := len(s); {
	case m >= 8:
		a, b = le64(s, 0), le64(s, m-8)
	case m >= 4:
		a, b = le32(s, 0), le32(s, m-4)
	case m > 0:
		a = uint64(s[0])<<16 | uint64(s[m>>1])<<8 | uint64(s[m-1])
	}
	return mix(hashP1^uint64(n), mix(a^hashP2, b^h))
}

// The bits of a tenant hash are split so that the shard, the home slot and
// the fingerprint are independent: shard = low 8 bits, slot = the bits above
// them, fingerprint = the top 8 bits.
const shardBits = 8

const shardCount = 1 << shardBits

func shardIndex(h uint64) uint64 { return h & (shardCount - 1) }

func homeSlot(h uint64) uint64 { return h >> shardBits }

// fingerprint is never 0, which marks an empty slot.
func fingerprint(h uint64) uint8 {
	fp := uint8(h >> 56)
	if fp == 0 {
		fp = 1
	}
	return fp
}

// table is one shard's tenants with flags. Its set of tenants is immutable
// once built: a writer that adds or removes a tenant builds a new table and
// swaps the shard's pointer, so readers take no lock. A writer that only
// replaces the view of a tenant already there stores the new view into its
// slot (see set): with a million flagged tenants the refresh of enforcers
// before issue 37 announced about 500 tenants every 5 ms, spread over every shard, and
// copying each shard they touch cost the Checker 22 s of CPU per 20 s
// refresh already at 100,000 (bench/README.md, "Growth curves"). fps and views are parallel
// arrays; a slot is empty when its fingerprint is 0. At most half the slots
// are used, which bounds linear probe runs and guarantees every probe
// sequence meets an empty slot.
type table struct {
	mask uint64
	fps  []uint8
	// views are atomic so that set may replace one under readers; a load
	// is a plain move on the usual hardware.
	views []atomic.Pointer[tenantView]
	n     int
}

var emptyTable = newTable(nil)

// newTable indexes views, whose names must be distinct.
func newTable(views []*tenantView) *table {
	size := 8
	for size < 2*len(views) {
		size <<= 1
	}
	t := &table{mask: uint64(size - 1), fps: make([]uint8, size), views: make([]atomic.Pointer[tenantView], size), n: len(views)}
	for _, tv := range views {
		i := homeSlot(tv.hash) & t.mask
		for t.fps[i] != 0 {
			i = (i + 1) & t.mask
		}
		t.fps[i] = fingerprint(tv.hash)
		t.views[i].Store(tv)
	}
	return t
}

// get returns the view of the tenant called name whose hash is h, or nil.
func (t *table) get(h uint64, name string) *tenantView {
	fp := fingerprint(h)
	fps, views, mask := t.fps, t.views, t.mask
	for i := homeSlot(h) & mask; ; i = (i + 1) & mask {
		// Both loads are issued before either is tested, so on a hit the
		// view pointer's cache miss overlaps the fingerprint's instead of
		// following it (measured: worst case all-flagged ~12% faster).
		f, tv := fps[i], views[i].Load()
		if f == 0 {
			return nil
		}
		if f == fp && tv.is(h, name) {
			return tv
		}
	}
}

// slot returns the index of the slot of the tenant called name, whose
// hash is h, or -1 when t does not hold it.
func (t *table) slot(h uint64, name string) int {
	fp := fingerprint(h)
	for i := homeSlot(h) & t.mask; ; i = (i + 1) & t.mask {
		f := t.fps[i]
		if f == 0 {
			return -1
		}
		if f == fp && t.views[i].Load().is(h, name) {
			return int(i)
		}
	}
}

// set replaces the view in slot i (from slot) with tv, a view of the same
// tenant. Writers must be serialised: a writer that copies t into a new
// table meanwhile would miss the new view.
func (t *table) set(i int, tv *tenantView) { t.views[i].Store(tv) }

// each calls fn on every view in t.
func (t *table) each(fn func(*tenantView)) {
	for i := range t.views {
		if tv := t.views[i].Load(); tv != nil {
			fn(tv)
		}
	}
}

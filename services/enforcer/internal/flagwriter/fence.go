package flagwriter

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fencing: one writer at a time, even when two believe they lead.
//
// A leader that pauses (a GC pause, a stopped VM, a batch stuck on a slow
// Redis) past its lease is replaced while its flush is still running; when
// it resumes, the hashes it sends would undo what the new leader wrote —
// a blocked tenant's hash left empty. So every hash write carries its
// version, and the script that writes it (writeHash) refuses a version not
// above the one the hash holds: the version is the fencing token, checked
// atomically on the hash's own slot, so it works on a Redis Cluster too.
//
// Versions are ordered across writers by the lease (services/enforcer,
// lease.go): each acquisition grants a floor above every version any
// earlier leader was allowed, and each renewal a ceiling the leader's
// versions stay at or below; the next leader's floor is at or above that
// ceiling. Within its range a writer follows its clock (versions are
// microseconds, as ReadStored and the Checkers' staleness logic expect)
// but never goes back, so a leader whose clock is behind its
// predecessor's still writes versions above it: Checkers, which drop a
// read older than their view, never ignore the new leader.
//
// A hash whose flags all went keeps its version field alone for one
// flag_ttl (a tombstone, which Checkers read as "no flags"): without it a
// late write of an earlier leader could bring the flags back.

// Grant is what the leader lease allows the writer.
type Grant struct {
	// Floor: every version written is above it.
	Floor int64
	// Ceiling: and at most this. 0: no bound (a writer without a lease).
	Ceiling int64
	// Until: no write is sent after this instant (the lease, measured from
	// the renewal request's send time, less a margin). Zero: no bound.
	Until time.Time
}

// errNotLeading stops a flush whose writer lost the lead, or whose grant
// ran out, before it sends anything more.
var errNotLeading = errors.New("not leading: the leader lease lapsed or another writer's versions are newer")

// versionHeadroom keeps a writer following a clock ahead of its grant
// below the ceiling with room to count up (one per batch) until the next
// renewal raises it.
const versionHeadroom = int64(time.Second / time.Microsecond)

// Lead makes the writer write under g. Taking the lead schedules a full
// rewrite with the fail modes, so the new leader's first write carries its
// whole table (the caller has merged the flags in Redis into it first:
// never lower enforcement).
func (w *Writer) Lead(g Grant) {
	w.Renew(g)
	w.SetLeading(true)
}

// Renew replaces the grant without taking the lead: a renewal of the
// lease, which must not give the lead back to a writer that stopped for a
// fenced write before the flags in Redis are merged again.
func (w *Writer) Renew(g Grant) {
	w.grantMu.Lock()
	w.grant = g
	w.grantMu.Unlock()
}

// currentGrant returns the grant in force.
func (w *Writer) currentGrant() Grant {
	w.grantMu.Lock()
	defer w.grantMu.Unlock()
	return w.grant
}

// mayWrite reports whether a batch may be sent at now: the writer leads
// and its grant has not run out.
func (w *Writer) mayWrite(now time.Time) bool {
	if !w.leading.Load() {
		return false
	}
	g := w.currentGrant()
	return g.Until.IsZero() || now.Before(g.Until)
}

// batchContext bounds a batch by batchTimeout and by the grant's deadline:
// a batch is not sent, or still retried, once the lease may be another's.
func (w *Writer) batchContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	if g := w.currentGrant(); !g.Until.IsZero() {
		c2, cancel2 := context.WithDeadline(ctx, g.Until)
		return c2, func() { cancel2(); cancel() }
	}
	return ctx, cancel
}

// nextVersion returns the version of the next batch: above the last one
// and the grant's floor, following now while that stays below the ceiling
// by versionHeadroom. It reports false when the grant is used up (a
// ceiling not renewed in time), and the batch must not be sent.
func (w *Writer) nextVersion(now time.Time) (int64, bool) {
	w.grantMu.Lock()
	defer w.grantMu.Unlock()
	g := w.grant
	ceiling := g.Ceiling
	if ceiling <= 0 {
		ceiling = math.MaxInt64
	}
	clock := min(now.UnixMicro(), ceiling-versionHeadroom)
	v := max(w.version+1, g.Floor+1, clock)
	if v > ceiling {
		return 0, false
	}
	w.version = v
	w.newest = max(w.newest, v)
	return v, true
}

// fenced records that a write was refused because Redis holds version
// newer: another writer leads, or led with a clock ahead. The writer stops
// until the lease grants it the lead again, with a floor above newer
// (Newest), and a full rewrite.
func (w *Writer) fenced(tenant string, newer int64) {
	w.statMu.Lock()
	w.Fenced++
	n := w.Fenced
	w.statMu.Unlock()
	w.grantMu.Lock()
	w.newest = max(w.newest, newer)
	w.grantMu.Unlock()
	if w.leading.CompareAndSwap(true, false) {
		w.log.Warn("enforcer: a flag write was refused because Redis holds a newer version (another replica leads, or one led with its clock ahead); this replica stops writing until the lease grants it a newer range",
			"tenant", tenant, "newer_version", newer, "fenced_so_far", n)
	}
}

// Newest returns the highest version the writer used or found in Redis
// (refused writes, the version key, ReadStored): the lease grants the next
// range above it, so that a writer counting up from a floor far ahead of
// the clock (its predecessor's clock was) never runs out of room.
func (w *Writer) Newest() int64 {
	w.grantMu.Lock()
	defer w.grantMu.Unlock()
	return w.newest
}

// writeHash writes the flag hash KEYS[1] under version ARGV[2], unless the
// hash holds that version or a newer one (it then answers {0, version
// held}; otherwise {1, ARGV[2]}). With flags (field, value pairs from
// ARGV[4]) it replaces the hash whole — DEL, HSET of @v and the flags in
// chunks that fit Lua's stack, PEXPIRE ARGV[1] ms unless 0 — or, when
// ARGV[3] is '1' (the fields are those this writer last wrote there), HSET
// and PEXPIRE without the DEL, half the work for a reader who sees the old
// values or the new ones all the same. Without flags it leaves a
// tombstone: @v alone, expiring after ARGV[1] ms (an existing tombstone
// keeps its expiry, so that repeated full rewrites do not keep it for
// ever). One script on one key is atomic and stays in one hash slot.
var writeHash = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], '@v')
if cur and tonumber(cur) and tonumber(cur) >= tonumber(ARGV[2]) then
  return {0, cur}
end
local n = #ARGV
if n > 3 then
  if ARGV[3] ~= '1' then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], '@v', ARGV[2])
  for i = 4, n, 1000 do
    redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, n)))
  end
  if tonumber(ARGV[1]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
elseif cur then
  local tomb = redis.call('HLEN', KEYS[1]) == 1
  if not tomb then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], '@v', ARGV[2])
  if not tomb and tonumber(ARGV[1]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
else
  redis.call('DEL', KEYS[1])
end
return {1, ARGV[2]}`)

// raiseVersion sets the version key KEYS[1] to ARGV[1] if that is higher
// than what it holds, and returns what it holds then: the key only grows,
// whichever writer gets there last.
var raiseVersion = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur or tonumber(ARGV[1]) > (tonumber(cur) or 0) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return cur`)

// scriptResult reads a writeHash answer: whether the write was done, and
// the version the hash holds if it was refused.
func scriptResult(cmd redis.Cmder) (ok bool, held int64, err error) {
	c, isCmd := cmd.(*redis.Cmd)
	if !isCmd {
		return true, 0, cmd.Err()
	}
	vals, err := c.Slice()
	if err != nil {
		return false, 0, err
	}
	if len(vals) != 2 {
		return false, 0, errors.New("writeHash: unexpected answer")
	}
	if n, _ := vals[0].(int64); n == 1 {
		return true, 0, nil
	}
	s, _ := vals[1].(string)
	held, _ = strconv.ParseInt(s, 10, 64)
	return false, held, nil
}

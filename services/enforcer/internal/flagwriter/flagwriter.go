// Package flagwriter writes the enforcer's flags to Redis in the layout of
// sdk/go/flags, coalescing changes: tenants whose flags changed join a
// bounded dirty set that is flushed every few milliseconds as two
// pipelines per batch (the hashes, then the announcements), so a burst of
// signals costs a handful of round trips. It also renews every flagged
// tenant's key before its expiry (flag_ttl) lapses — a slice at each flush,
// spread over the first half of each flag_ttl/3, so that a hundred thousand
// flagged tenants never hold up a changed flag behind one long refresh —
// beats the heartbeat Checkers use to judge staleness, publishes tenants'
// fail modes and its flag_ttl, and rewrites everything after Redis was
// unreachable or lost its data.
//
// A flag's Until is its breaker's own end, so a refresh of a tenant whose
// flags did not change finds the same values it wrote: it renews the key
// with one PEXPIRE and announces nothing, and Checkers refetch nothing. A
// Checker whose view goes stale (the enforcer died) drops traffic-tied
// flags flag_ttl after the enforcer's last heartbeat instead of at a
// capped Until (docs/flags.md, "Heartbeat and staleness"); the keys still
// expire flag_ttl after the last refresh, so Redis holds nothing a dead
// enforcer left for longer.
//
// The same writes work on one Redis and on a Redis Cluster: no command and
// no transaction spans two hash slots. Each hash (a tenant's flags, the
// fail modes) is replaced whole by one script call on its own key, so a
// reader never sees half of it — when its fields are those this writer
// last wrote there, by one HSET of them all and a PEXPIRE without the DEL,
// which a reader sees just as whole; a batch as a whole
// is not atomic, and need not be, because Checkers read per tenant. The version key and the pub/sub
// announcements follow only once every hash of the batch is written, so a
// Checker that refetches on an announcement reads what it announces (in a
// cluster the hashes are on other nodes than the announcement, and a
// pipeline's commands to different nodes run concurrently).
//
// Every hash write is fenced: it carries a version the leader lease
// orders across replicas, and Redis refuses it when the hash holds a newer
// one, so a leader paused past its lease cannot undo its successor's
// writes, and Checkers never see a new leader's version go back (fence.go).
package flagwriter

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Source is where the writer reads the flags it writes.
type Source interface {
	// Flags returns tenant's flags by field, each with its own end as
	// Until (not capped: an unchanged flag must read the same at every
	// refresh); nil when the tenant has none.
	Flags(tenant string) map[string]*flags.Flag
	// Tenants lists every tenant that has flags.
	Tenants() []string
}

// Config tunes the writer.
type Config struct {
	KeyPrefix      string
	FlushInterval  time.Duration // how long changes may wait to be coalesced
	FlagTTL        time.Duration // lifetime of the keys and, in Checkers, of the traffic flags a dead enforcer leaves behind
	HeartbeatEvery time.Duration
	MaxDirty       int // dirty tenants held; beyond it, a full rewrite replaces them
	BatchTenants   int // tenants per pipelined MULTI
	// OnFlush, if set, is called as each flush begins; the function it
	// returns is called if that flush succeeded. Everything marked dirty
	// before the call is then in Redis: the enforcer commits the signal
	// offsets it had applied by then.
	OnFlush func() (flushed func())
}

// Writer writes flags; MarkDirty is safe for concurrent use.
type Writer struct {
	rdb  redis.UniversalClient
	src  Source
	cfg  Config
	keys flags.Layout
	log  *slog.Logger

	// leading is whether this replica writes; only the leader writes flags
	// and heartbeats (see services/enforcer/README.md). A follower keeps
	// its dirty set (bounded: beyond MaxDirty it becomes one full rewrite)
	// and rewrites everything when it takes over.
	leading atomic.Bool

	mu    sync.Mutex
	dirty map[string]struct{}
	full  bool // rewrite everything at the next flush
	// refresh is the tenants the current refresh has still to rewrite,
	// refreshPer of them at each flush (see beginRefresh).
	refresh    []string
	refreshPer int
	failModes  map[string]string
	fmDirty    bool

	// written is the tenants that have a hash in Redis, each with the
	// signatures of what this writer last wrote there (flush goroutine
	// only): a tenant written again with the same fields needs no DEL,
	// with the same values no write at all.
	written map[string]hashSig
	sigSeed maphash.Seed
	version int64 // of the last batch; guarded by grantMu
	down    bool

	// grant is the range of versions and the deadline the leader lease
	// allows (fence.go); newest the highest version used or found in
	// Redis, which the lease grants the next range above.
	grantMu sync.Mutex
	grant   Grant
	newest  int64

	// Flushes counts batches written (a pipeline of hashes, then one of
	// announcements); Errors counts failed ones; Fenced counts hash writes
	// Redis refused because it held a newer version (fence.go).
	Flushes, Errors, FullRewrites, Fenced int64
	statMu                                sync.Mutex
}

// New returns a writer; Run does the work.
func New(rdb redis.UniversalClient, src Source, cfg Config, log *slog.Logger) *Writer {
	w := &Writer{rdb: rdb, src: src, cfg: cfg, keys: flags.Layout{Prefix: cfg.KeyPrefix}, log: log,
		dirty: map[string]struct{}{}, written: map[string]hashSig{}, sigSeed: maphash.MakeSeed(), full: true}
	w.leading.Store(true)
	return w
}

// SetLeading makes the writer write (true) or stay silent (false). Taking
// the lead schedules a full rewrite with the fail modes, so the new
// leader's first write carries its whole table; the caller has merged the
// flags in Redis into that table first (never lower enforcement).
func (w *Writer) SetLeading(on bool) {
	if on && !w.leading.Load() {
		w.mu.Lock()
		w.full, w.fmDirty = true, true
		w.mu.Unlock()
	}
	w.leading.Store(on)
}

// Leading reports whether the writer writes.
func (w *Writer) Leading() bool { return w.leading.Load() }

// MarkDirty queues tenants for the next flush. When the dirty set is full
// the writer forgets it and rewrites every tenant instead: same result,
// bounded memory.
func (w *Writer) MarkDirty(tenants ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.markDirtyLocked(tenants...)
}

func (w *Writer) markDirtyLocked(tenants ...string) {
	if w.full {
		return
	}
	for _, t := range tenants {
		if len(w.dirty) >= w.cfg.MaxDirty {
			w.full = true
			clear(w.dirty)
			return
		}
		w.dirty[t] = struct{}{}
	}
}

// SetFailModes publishes each tenant's fail mode ("*" = the default).
func (w *Writer) SetFailModes(m map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failModes, w.fmDirty = m, true
}

// FencedWrites returns how many hash writes Redis refused for holding a
// newer version (fence.go).
func (w *Writer) FencedWrites() int64 {
	w.statMu.Lock()
	defer w.statMu.Unlock()
	return w.Fenced
}

// Stats returns the flush counters.
func (w *Writer) Stats() (flushes, errs, fullRewrites int64) {
	w.statMu.Lock()
	defer w.statMu.Unlock()
	return w.Flushes, w.Errors, w.FullRewrites
}

// Run flushes until ctx is cancelled, then makes a last flush within
// grace so that changes accepted before shutdown reach Redis.
func (w *Writer) Run(ctx context.Context, grace time.Duration) error {
	flush := time.NewTicker(w.cfg.FlushInterval)
	defer flush.Stop()
	refresh := time.NewTicker(w.cfg.FlagTTL / 3)
	defer refresh.Stop()
	beat := time.NewTicker(w.cfg.HeartbeatEvery)
	defer beat.Stop()
	if w.leading.Load() {
		w.heartbeat(ctx)
	}
	for {
		if !w.leading.Load() {
			select {
			case <-ctx.Done():
				return nil
			case <-flush.C:
			case <-refresh.C:
			case <-beat.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			w.Flush(fctx)
			return nil
		case <-flush.C:
			w.Flush(ctx)
		case <-refresh.C:
			w.beginRefresh()
		case <-beat.C:
			w.heartbeat(ctx)
		}
	}
}

// beginRefresh starts a refresh of every flagged tenant, which runs every
// flag_ttl/3: a tenant whose flags read as this writer last wrote them
// (the common case: Until is the breaker's own end, not a cap that moves)
// gets its key's expiry renewed, nothing else and no announcement; any
// other is rewritten and announced, which repairs whatever a lost write
// left behind. The tenants are queued and every flush takes a slice of
// them, sized so that the queue is empty after about flag_ttl/6: each key
// is renewed at most flag_ttl/3 + flag_ttl/6 after the last time, half its
// lifetime. A pending full rewrite covers everything, so nothing is queued
// then.
//
// A refresh used to rewrite and announce every flagged tenant, because
// Until was capped at flag_ttl ahead: at 100,000 flagged tenants 100,000
// announcements every 20 s, and as many HGETALLs from every gateway
// (bench/README.md, "Growth curves").
//
// If the previous refresh is not done (Redis slower than the refresh
// needs), its rest — the tenants rewritten longest ago — heads the new
// queue. It used to join the dirty set: one flush of all of it, and past
// max_dirty a full rewrite (a SCAN and the script for every tenant), the
// dearest write at the moment Redis is behind; at 1,000,000 flagged
// tenants a refresh at 125% of flag_ttl/3 (measured on a loaded 2-core
// machine) left 250,000 behind and became a full rewrite every time.
//
// Before that, a refresh was one full rewrite of every tenant in one flush:
// 100,000 flagged tenants took 11 s on a busy 2-core machine, beyond
// the write's deadline, so it failed and was retried whole, and the flags
// lapsed (bench/README.md, "Growth curves").
func (w *Writer) beginRefresh() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.full {
		w.refresh = nil
		return
	}
	rest := w.refresh
	seen := make(map[string]struct{}, len(w.written))
	queue := make([]string, 0, len(w.written))
	add := func(t string) {
		if _, dup := seen[t]; !dup {
			seen[t] = struct{}{}
			queue = append(queue, t)
		}
	}
	for _, t := range rest {
		add(t)
	}
	for _, t := range w.src.Tenants() {
		add(t)
	}
	for t := range w.written { // tenants whose flags went: deleted
		add(t)
	}
	w.refresh = queue
	spread := max(w.cfg.FlagTTL/6, w.cfg.FlushInterval)
	per := (int64(len(queue))*int64(w.cfg.FlushInterval) + int64(spread) - 1) / int64(spread)
	w.refreshPer = int(max(per, minRefreshSlice))
}

// minRefreshSlice is the fewest tenants a flush refreshes: below it the
// round trips, not the tenants, would be the cost.
const minRefreshSlice = 100

// refreshing reports whether a refresh still has tenants to write.
func (w *Writer) refreshing() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.full || len(w.refresh) > 0
}

// heartbeat sets the heartbeat key and announces it; it also notices a
// Redis that lost its data (the epoch key is gone) and schedules a full
// rewrite.
func (w *Writer) heartbeat(ctx context.Context) {
	now := time.Now()
	if !w.mayWrite(now) {
		// A lapsed lead must not tell Checkers the flags are fresh.
		return
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatEvery)
	defer cancel()
	var exists *redis.IntCmd
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, w.keys.Prefix+"epoch")
		p.Set(ctx, w.keys.HeartbeatKey(), now.UnixMilli(), 3*w.cfg.HeartbeatEvery)
		// Every beat, not once: a Redis that lost its data, or a key
		// someone deleted, has it back within a second, and Checkers need
		// it most when the enforcer is gone.
		p.Set(ctx, w.keys.TTLKey(), w.cfg.FlagTTL.Milliseconds(), 0)
		p.Publish(ctx, w.keys.Channel(), flags.FormatChange(flags.HeartbeatTenant, now.UnixMilli()))
		return nil
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if !w.down {
			w.log.Warn("enforcer: redis unreachable; keeping state, will rewrite every flag when it is back", "err", err)
		}
		w.down, w.full = true, true
		return
	}
	if exists.Val() == 0 {
		// A fresh or restarted Redis: nothing we wrote survived.
		w.full, w.fmDirty = true, true
	}
}

// Flush writes what is dirty now. It reports whether Redis took it.
func (w *Writer) Flush(ctx context.Context) bool {
	var flushed func()
	if w.cfg.OnFlush != nil {
		flushed = w.cfg.OnFlush()
	}
	ok := w.flush(ctx)
	if ok && flushed != nil {
		flushed()
	}
	return ok
}

// flush is Flush without the OnFlush calls. A flush with nothing dirty
// succeeds: whatever was marked before it was written by an earlier flush
// that succeeded, or is part of the full rewrite a failed one scheduled.
func (w *Writer) flush(ctx context.Context) bool {
	w.mu.Lock()
	full, fmDirty := w.full, w.fmDirty
	var tenants []string
	if full {
		seen := map[string]struct{}{}
		for _, t := range w.src.Tenants() {
			seen[t] = struct{}{}
		}
		for t := range w.written {
			seen[t] = struct{}{}
		}
		for t := range w.dirty {
			seen[t] = struct{}{}
		}
		for t := range seen {
			tenants = append(tenants, t)
		}
		w.refresh = nil // the full rewrite refreshes everyone
	} else {
		for t := range w.dirty {
			tenants = append(tenants, t)
		}
		n := min(len(w.refresh), w.refreshPer)
		for _, t := range w.refresh[:n] {
			if _, dup := w.dirty[t]; !dup {
				tenants = append(tenants, t)
			}
		}
		w.refresh = w.refresh[n:]
		if len(w.refresh) == 0 {
			w.refresh = nil // let the queue's array go
		}
	}
	clear(w.dirty)
	w.full, w.fmDirty = false, false
	failModes := w.failModes
	w.mu.Unlock()
	if len(tenants) == 0 && !fmDirty && !full {
		return true
	}

	if full {
		// Hashes an earlier enforcer left (its breakers are gone with its
		// memory) are rewritten too, which deletes them: otherwise they
		// would refuse tenants until their TTL ran out.
		tenants = w.withLeftovers(ctx, tenants)
	}
	err := w.write(ctx, tenants, full, fmDirty, failModes)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		// Keep everything for the next attempt; a full rewrite covers it
		// whatever happened to the pipeline halfway.
		w.full, w.fmDirty = true, w.fmDirty || fmDirty
		if errors.Is(err, errNotLeading) {
			// Not Redis's fault: the next lead rewrites everything.
			return false
		}
		if !w.down {
			w.log.Warn("enforcer: flag write failed; keeping state and retrying", "tenants", len(tenants), "err", err)
		}
		w.down = true
		return false
	}
	if w.down {
		w.log.Info("enforcer: redis is back; flags rewritten", "tenants", len(tenants))
		w.down = false
	}
	return true
}

// withLeftovers adds the tenants of every flag hash in Redis to tenants.
// A failed scan is not fatal: the rewrite of known tenants still helps, and
// leftovers expire by TTL.
func (w *Writer) withLeftovers(ctx context.Context, tenants []string) []string {
	seen := make(map[string]struct{}, len(tenants))
	for _, t := range tenants {
		seen[t] = struct{}{}
	}
	err := w.keys.ScanTenants(ctx, w.rdb, func(t string) {
		if _, dup := seen[t]; !dup {
			seen[t] = struct{}{}
			tenants = append(tenants, t)
		}
	})
	if err != nil {
		w.log.Warn("enforcer: scanning for leftover flags failed; they will expire by TTL", "err", err)
	}
	return tenants
}

// scriptOnly makes every hash write replace the hash (DEL first), as
// before the light path for unchanged fields: BenchmarkScaleEnforcer sets
// it (SLUICE_ENFORCER_SCRIPT_ONLY=1) to measure both with the same binary.
var scriptOnly bool

// hashSig is what the writer remembers of a tenant hash it wrote: a
// signature of its set of fields and one of its fields with their values,
// each the XOR of the parts' hashes (fields are distinct, so none cancels
// another).
type hashSig struct{ fields, content uint64 }

// sigOf returns the signatures of a tenant hash of the encoded values by
// field.
func (w *Writer) sigOf(values map[string]string) hashSig {
	sig := hashSig{fields: uint64(len(values)), content: uint64(len(values))}
	for field, v := range values {
		sig.fields ^= maphash.String(w.sigSeed, field)
		sig.content ^= maphash.String(w.sigSeed, field+"\x00"+v)
	}
	return sig
}

// hashWrite is one writeHash call: no fields leaves a tombstone (or
// nothing, where there was no hash).
type hashWrite struct {
	key    string
	tenant string // "" for the fail-mode hash
	args   []any  // ttl ms, version, same-fields flag, then field, value, …
}

// sameFields marks a hash whose fields are those it had when this writer
// last wrote it (the refresh of an unchanged tenant): writeHash then
// skips the DEL. A refresh of 1,000,000 tenants cost Redis half the CPU
// that way before the script took the version check (bench/README.md,
// "Growth curves").
func hashArgs(ttl string, version int64, sameFields bool, pairs int) []any {
	same := "0"
	if sameFields {
		same = "1"
	}
	args := make([]any, 0, 3+2*pairs)
	return append(args, ttl, version, same)
}

// replace runs the hash writes (and sets the epoch key when epoch is
// non-empty) in one pipeline and returns each write's command. The writes
// a node refused with NOSCRIPT (a fresh or restarted Redis that has not
// seen the script yet) are sent again with the script's text, and only
// they: one sent twice would be refused the second time as not newer.
func (w *Writer) replace(ctx context.Context, writes []hashWrite, epoch string) ([]redis.Cmder, error) {
	cmds, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if epoch != "" {
			p.Set(ctx, w.keys.Prefix+"epoch", epoch, 0)
		}
		for _, hw := range writes {
			writeHash.EvalSha(ctx, p, []string{hw.key}, hw.args...)
		}
		return nil
	})
	if epoch != "" && len(cmds) > 0 {
		if cerr := cmds[0].Err(); cerr != nil && err == nil {
			err = cerr
		}
		cmds = cmds[1:]
	}
	var again []int
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) == 0 || len(cmds) != len(writes) {
		return cmds, err
	}
	retried, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range again {
			writeHash.Eval(ctx, p, []string{writes[i].key}, writes[i].args...)
		}
		return nil
	})
	for k, i := range again {
		if k < len(retried) {
			cmds[i] = retried[k]
		}
	}
	if err == nil {
		for _, c := range cmds {
			if c.Err() != nil {
				return cmds, c.Err()
			}
		}
	}
	return cmds, err
}

// batchTimeout bounds one batch's pipelines (the hashes, then the
// announcements): an unreachable Redis fails the flush within it.
const batchTimeout = 10 * time.Second

// batch is one pipeline's worth of a write: its hash writes, and what the
// writer remembers of them once Redis took them.
type batch struct {
	version int64
	writes  []hashWrite
	epoch   string
	present []string
	sigs    []hashSig // of present
	gone    []string
	tenants []string // written, and announced
	// touched are tenants whose flags read as last written: their keys'
	// expiry is renewed, nothing written, nothing announced.
	touched []string
	failMod bool // the fail-mode hash is in writes
}

func (w *Writer) write(ctx context.Context, tenants []string, full, fmDirty bool, failModes map[string]string) error {
	batchSize := max(w.cfg.BatchTenants, 1)
	first := true
	for first || len(tenants) > 0 {
		// Each batch asks the lease from its own start: a full rewrite
		// of a million tenants can outlast the lease.
		now := time.Now()
		if !w.mayWrite(now) {
			return errNotLeading
		}
		version, ok := w.nextVersion(now)
		if !ok {
			return errNotLeading
		}
		n := min(len(tenants), batchSize)
		b := w.buildBatch(tenants[:n], now, version, full, first && full, first && fmDirty, failModes)
		tenants = tenants[n:]
		if err := w.sendBatch(ctx, b); err != nil {
			return err
		}
		first = false
	}
	return nil
}

// buildBatch reads part's flags from the source at now into the hash
// writes of one batch under version; with epoch the batch marks a full
// rewrite, with failMode it also writes the fail-mode hash.
func (w *Writer) buildBatch(part []string, now time.Time, version int64, full, epoch, failMode bool, failModes map[string]string) *batch {
	ttl := strconv.FormatInt(w.cfg.FlagTTL.Milliseconds(), 10)
	b := &batch{version: version, failMod: failMode, writes: make([]hashWrite, 0, len(part)+1)}
	if epoch {
		b.epoch = strconv.FormatInt(now.UnixMilli(), 10)
	}
	if failMode {
		args := hashArgs("0", version, false, len(failModes)) // no expiry: known after the enforcer died
		for t, m := range failModes {
			args = append(args, t, m)
		}
		b.writes = append(b.writes, hashWrite{key: w.keys.FailModeKey(), args: args})
	}
	for _, t := range part {
		fl := w.src.Flags(t)
		values := make(map[string]string, len(fl))
		for field, f := range fl {
			values[field] = flags.Encode(f)
		}
		same := false
		if len(values) > 0 {
			sig := w.sigOf(values)
			// Not in a full rewrite: that one also repairs whatever
			// else happened to Redis (another writer, lost data).
			prev, ok := w.written[t]
			if !full && ok && prev == sig && !unchangedRewritten {
				b.touched = append(b.touched, t)
				continue
			}
			same = !full && ok && prev.fields == sig.fields && !scriptOnly
			b.present, b.sigs = append(b.present, t), append(b.sigs, sig)
		} else {
			b.gone = append(b.gone, t)
		}
		args := hashArgs(ttl, version, same, len(values))
		for field, v := range values {
			args = append(args, field, v)
		}
		b.writes = append(b.writes, hashWrite{key: w.keys.TenantKey(t), tenant: t, args: args})
		b.tenants = append(b.tenants, t)
	}
	return b
}

// unchangedRewritten makes every refresh rewrite and announce unchanged
// tenants too, as when Until was capped at flag_ttl ahead and moved at
// every refresh: BenchmarkScaleEnforcer sets it
// (SLUICE_ENFORCER_REWRITE_UNCHANGED=1) to measure both with one binary.
var unchangedRewritten bool

// touch renews the expiry of the keys of tenants whose flags did not
// change, in one pipeline, and returns those whose key was gone (deleted
// by hand, evicted, or expired while Redis was out of reach): they need a
// real write. A PEXPIRE is not fenced, and need not be: it changes no
// field, and a deposed leader's can only keep a key flag_ttl longer.
func (w *Writer) touch(ctx context.Context, tenants []string) ([]string, error) {
	cmds := make([]*redis.BoolCmd, len(tenants))
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range tenants {
			cmds[i] = p.PExpire(ctx, w.keys.TenantKey(t), w.cfg.FlagTTL)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var missing []string
	for i, c := range cmds {
		if !c.Val() {
			missing = append(missing, tenants[i])
		}
	}
	return missing, nil
}

// sendBatch writes b's hashes, then — only once every one of them is in
// place — raises the version key and announces them. A write refused for
// an older version (fenced) stops the writer: errNotLeading.
func (w *Writer) sendBatch(ctx context.Context, b *batch) error {
	// Each batch has its own deadline: one for the whole write made a
	// full rewrite of 100,000 tenants on a busy machine fail every
	// time, however healthy Redis was.
	bctx, cancel := w.batchContext(ctx)
	defer cancel()
	var err error
	refused := false
	if len(b.writes) > 0 || b.epoch != "" {
		var cmds []redis.Cmder
		cmds, err = w.replace(bctx, b.writes, b.epoch)
		if err == nil {
			refused = w.checkFence(cmds, b)
		}
	}
	var missing []string
	if err == nil && len(b.touched) > 0 {
		missing, err = w.touch(bctx, b.touched)
	}
	if err == nil && (len(b.tenants) > 0 || b.failMod) {
		err = w.announce(bctx, b)
	}
	w.statMu.Lock()
	w.Flushes++
	if err != nil {
		w.Errors++
	} else if b.epoch != "" {
		w.FullRewrites++
	}
	w.statMu.Unlock()
	if err != nil {
		return fmt.Errorf("write %d tenants: %w", len(b.tenants), err)
	}
	if refused {
		return errNotLeading
	}
	for i, t := range b.present {
		w.written[t] = b.sigs[i]
	}
	for _, t := range b.gone {
		delete(w.written, t)
	}
	if len(missing) > 0 {
		for _, t := range missing {
			delete(w.written, t) // so that the next write is a whole one
		}
		w.MarkDirty(missing...)
	}
	return nil
}

// checkFence reads each hash write's answer and reports whether any was
// refused for an older version (counted, logged, and the writer stops).
func (w *Writer) checkFence(cmds []redis.Cmder, b *batch) bool {
	refused := false
	for i, c := range cmds {
		ok, held, err := scriptResult(c)
		if err != nil || ok || i >= len(b.writes) {
			continue
		}
		refused = true
		// Not what this writer holds: let the next rewrite decide.
		delete(w.written, b.writes[i].tenant)
		w.fenced(b.writes[i].tenant, held)
	}
	return refused
}

// announce raises the version key to b's version and publishes a change
// per tenant of b (and of the fail modes). A version key found higher is
// a newer writer's: the lease raises this writer's next grant above it.
func (w *Writer) announce(ctx context.Context, b *batch) error {
	// By its text, not its SHA: a NOSCRIPT would mean sending the
	// announcements twice, and a Checker resyncs on each fail-mode one.
	// The script is a few lines, and Redis caches what EVAL compiles.
	cmds, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(b.tenants) > 0 {
			raiseVersion.Eval(ctx, p, []string{w.keys.VersionKey()}, b.version)
		}
		if b.failMod {
			p.Publish(ctx, w.keys.Channel(), flags.FormatChange(flags.FailModeTenant, b.version))
		}
		for _, t := range b.tenants {
			p.Publish(ctx, w.keys.Channel(), flags.FormatChange(t, b.version))
		}
		return nil
	})
	if err == nil && len(b.tenants) > 0 {
		if c, ok := cmds[0].(*redis.Cmd); ok {
			if s, _ := c.Text(); s != "" {
				if v, perr := strconv.ParseInt(s, 10, 64); perr == nil && v > b.version {
					w.grantMu.Lock()
					w.newest = max(w.newest, v)
					w.grantMu.Unlock()
				}
			}
		}
	}
	return err
}

// Stored is one tenant's flags as Redis holds them.
type Stored struct {
	Tenant string
	// Written is when they were written (the hash's version is a time in
	// microseconds); zero when the version is missing.
	Written time.Time
	// Flags are the decodable flags by field.
	Flags map[string]*flags.Flag
}

// ReadStored returns every tenant's flags under the prefix: what an earlier
// enforcer (or another replica) left in force. A restarted enforcer takes
// them as the floor of its state before writing anything (see
// breaker.Table.Restore). Values it cannot decode are logged and skipped;
// an unreachable Redis is an error, and the caller retries.
func (w *Writer) ReadStored(ctx context.Context) ([]Stored, error) {
	var keys []string
	seen := map[string]struct{}{}
	err := w.keys.ScanTenants(ctx, w.rdb, func(t string) {
		if _, dup := seen[t]; !dup {
			seen[t] = struct{}{}
			keys = append(keys, w.keys.TenantKey(t))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("scan flags: %w", err)
	}
	var out []Stored
	var newest int64 // the highest version read: the lease grants above it
	defer func() {
		w.grantMu.Lock()
		w.newest = max(w.newest, newest)
		w.grantMu.Unlock()
	}()
	for len(keys) > 0 {
		n := min(len(keys), max(w.cfg.BatchTenants, 1))
		part := keys[:n]
		keys = keys[n:]
		cmds := make([]*redis.MapStringStringCmd, len(part))
		if _, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range part {
				cmds[i] = p.HGetAll(ctx, k)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("read flags: %w", err)
		}
		for i, k := range part {
			tenant, ok := w.keys.TenantFromKey(k)
			if !ok {
				continue
			}
			st := Stored{Tenant: tenant, Flags: map[string]*flags.Flag{}}
			for field, v := range cmds[i].Val() {
				if field == flags.VersionField {
					if us, err := strconv.ParseInt(v, 10, 64); err == nil && us > 0 {
						st.Written = time.UnixMicro(us)
						newest = max(newest, us)
					}
					continue
				}
				f, err := flags.Decode(v)
				if err != nil {
					w.log.Warn("enforcer: skipping an undecodable flag in redis", "tenant", tenant, "field", field, "err", err)
					continue
				}
				st.Flags[field] = f
			}
			if len(st.Flags) > 0 {
				out = append(out, st)
			}
		}
	}
	return out, nil
}

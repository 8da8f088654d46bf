// Package flagwriter writes the enforcer's flags to Redis in the layout of
// gateway/flags, coalescing changes: tenants whose flags changed join a
// bounded dirty set that is flushed every few milliseconds as one pipelined
// MULTI per batch, so a burst of signals costs a handful of round trips.
// It also refreshes every flag before its TTL lapses, beats the heartbeat
// Checkers use to judge staleness, publishes tenants' fail modes, and
// rewrites everything after Redis was unreachable or lost its data.
package flagwriter

import (
	"context"

	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/gateway/flags"
)

// Source is where the writer reads the flags it writes.
type Source interface {
	// Flags returns tenant's flags by field, with Until capped at now+ttl;
	// nil when the tenant has none.
	Flags(tenant string, now time.Time, ttl time.Duration) map[string]*flags.Flag
	// Tenants lists every tenant that has flags.
	Tenants() []string
}

// Config tunes the writer.
type Config struct {
	KeyPrefix      string
	FlushInterval  time.Duration // how long changes may wait to be coalesced
	FlagTTL        time.Duration // lifetime of a flag a dead enforcer leaves behind
	HeartbeatEvery time.Duration
	MaxDirty       int // dirty tenants held; beyond it, a full rewrite replaces them
	BatchTenants   int // tenants per pipelined MULTI
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

	mu        sync.Mutex
	dirty     map[string]struct{}
	full      bool // rewrite everything at the next flush
	failModes map[string]string
	fmDirty   bool

	// written is the tenants that have a hash in Redis (flush goroutine only).
	written map[string]struct{}
	version int64
	down    bool

	// Flushes counts pipelined write round trips; Errors counts failed ones.
	Flushes, Errors, FullRewrites int64
	statMu                        sync.Mutex
}

// New returns a writer; Run does the work.
func New(rdb redis.UniversalClient, src Source, cfg Config, log *slog.Logger) *Writer {
	w := &Writer{rdb: rdb, src: src, cfg: cfg, keys: flags.Layout{Prefix: cfg.KeyPrefix}, log: log,
		dirty: map[string]struct{}{}, written: map[string]struct{}{}, full: true}
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
			// Rewriting extends every flag's Until and the keys' expiry.
			w.mu.Lock()
			w.full = true
			w.mu.Unlock()
		case <-beat.C:
			w.heartbeat(ctx)
		}
	}
}

// heartbeat sets the heartbeat key and announces it; it also notices a
// Redis that lost its data (the epoch key is gone) and schedules a full
// rewrite.
func (w *Writer) heartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatEvery)
	defer cancel()
	now := time.Now()
	var exists *redis.IntCmd
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, w.keys.Prefix+"epoch")
		p.Set(ctx, w.keys.HeartbeatKey(), now.UnixMilli(), 3*w.cfg.HeartbeatEvery)
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
	} else {
		for t := range w.dirty {
			tenants = append(tenants, t)
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
	iter := w.rdb.Scan(ctx, 0, w.keys.TenantPattern(), 1000).Iterator()
	for iter.Next(ctx) {
		if t, ok := w.keys.TenantFromKey(iter.Val()); ok {
			if _, dup := seen[t]; !dup {
				seen[t] = struct{}{}
				tenants = append(tenants, t)
			}
		}
	}
	if err := iter.Err(); err != nil {
		w.log.Warn("enforcer: scanning for leftover flags failed; they will expire by TTL", "err", err)
	}
	return tenants
}

func (w *Writer) nextVersion() int64 {
	v := time.Now().UnixMicro()
	if v <= w.version {
		v = w.version + 1
	}
	w.version = v
	return v
}

func (w *Writer) write(ctx context.Context, tenants []string, full, fmDirty bool, failModes map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := time.Now()
	batch := max(w.cfg.BatchTenants, 1)
	first := true
	for first || len(tenants) > 0 {
		n := min(len(tenants), batch)
		part := tenants[:n]
		tenants = tenants[n:]
		version := w.nextVersion()
		var present, gone []string
		_, err := w.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if first && full {
				p.Set(ctx, w.keys.Prefix+"epoch", strconv.FormatInt(now.UnixMilli(), 10), 0)
			}
			if first && fmDirty {
				p.Del(ctx, w.keys.FailModeKey())
				if len(failModes) > 0 {
					p.HSet(ctx, w.keys.FailModeKey(), failModes)
				}
				p.Publish(ctx, w.keys.Channel(), flags.FormatChange(flags.FailModeTenant, version))
			}
			for _, t := range part {
				key := w.keys.TenantKey(t)
				fl := w.src.Flags(t, now, w.cfg.FlagTTL)
				p.Del(ctx, key)
				if len(fl) > 0 {
					vals := make([]any, 0, 2*len(fl)+2)
					vals = append(vals, flags.VersionField, version)
					for field, f := range fl {
						vals = append(vals, field, flags.Encode(f))
					}
					p.HSet(ctx, key, vals...)
					p.PExpire(ctx, key, w.cfg.FlagTTL)
					present = append(present, t)
				} else {
					gone = append(gone, t)
				}
				p.Publish(ctx, w.keys.Channel(), flags.FormatChange(t, version))
			}
			if len(part) > 0 {
				p.Set(ctx, w.keys.VersionKey(), version, 0)
			}
			return nil
		})
		w.statMu.Lock()
		w.Flushes++
		if err != nil {
			w.Errors++
		} else if full && first {
			w.FullRewrites++
		}
		w.statMu.Unlock()
		if err != nil {
			return fmt.Errorf("write %d tenants: %w", len(part), err)
		}
		for _, t := range present {
			w.written[t] = struct{}{}
		}
		for _, t := range gone {
			delete(w.written, t)
		}
		first = false
	}
	return nil
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
	iter := w.rdb.Scan(ctx, 0, w.keys.TenantPattern(), 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("scan flags: %w", err)
	}
	var out []Stored
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

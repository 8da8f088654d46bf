package flagwriter

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// While the writer runs, no flag lapses: refreshes rewritten a slice per
// flush keep every tenant's key and every flag's Until ahead of the clock
// through several flag_ttl, and they do extend the Until (a refresh that
// did nothing would let the first check below fail within one flag_ttl).
func TestSpreadRefreshKeepsEveryFlag(t *testing.T) {
	rdb := redisconn.NewClient(itest.Redis(t))
	defer rdb.Close()
	prefix := itest.Unique(t, "sluice_test_") + ":"
	keys := flags.Layout{Prefix: prefix}
	ctx := context.Background()
	t.Cleanup(func() { _ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) }) })
	const n, ttl = 500, 3 * time.Second
	src := newFlagged(n)
	cfg := Config{KeyPrefix: prefix, FlushInterval: 5 * time.Millisecond, FlagTTL: ttl,
		HeartbeatEvery: time.Second, MaxDirty: 10_000, BatchTenants: 100}
	w := New(rdb, src, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(rctx, time.Second) }()
	defer func() { cancel(); <-done }()

	read := func() []*redis.StringCmd {
		cmds := make([]*redis.StringCmd, n)
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, tn := range src.names {
				cmds[i] = p.HGet(ctx, keys.TenantKey(tn), flags.AllModels)
			}
			return nil
		})
		return cmds
	}
	itest.Eventually(t, 30*time.Second, "every flag written", func() bool {
		for _, c := range read() {
			if c.Err() != nil {
				return false
			}
		}
		return true
	})
	var firstUntil, lastUntil time.Time
	end := time.Now().Add(3 * ttl)
	for time.Now().Before(end) {
		now := time.Now()
		for i, c := range read() {
			v, err := c.Result()
			if err != nil {
				t.Fatalf("tenant %s: flag gone %s after the start of the check: %v", src.names[i], now.Sub(end.Add(-3*ttl)), err)
			}
			f, err := flags.Decode(v)
			if err != nil {
				t.Fatal(err)
			}
			// The check may run a little behind the read; a flag a
			// Checker reads must still be in force.
			if !f.Until.After(now) {
				t.Fatalf("tenant %s: flag lapsed at %s (now %s)", src.names[i], f.Until, now)
			}
			if i == 0 {
				if firstUntil.IsZero() {
					firstUntil = f.Until
				}
				lastUntil = f.Until
			}
		}
		time.Sleep(50 * time.Millisecond) // pace the polls
	}
	if !lastUntil.After(firstUntil.Add(ttl)) {
		t.Errorf("flag Until went from %s to %s over %s: not refreshed", firstUntil, lastUntil, 3*ttl)
	}
	if flushes, errs, _ := w.Stats(); errs > 0 || flushes < 10 {
		t.Errorf("%d flushes, %d failed: want refreshes spread over several flushes, none failed", flushes, errs)
	}
}

// A refresh is queued, not written at once: each flush takes a slice, so a
// changed flag waits for one slice, not for every tenant.
func TestRefreshIsSpreadOverFlushes(t *testing.T) {
	w := New(nil, newFlagged(1000), Config{FlushInterval: 5 * time.Millisecond, FlagTTL: time.Minute, MaxDirty: 10}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.full = false // as after the first successful flush
	w.beginRefresh()
	if len(w.refresh) != 1000 || w.refreshPer != minRefreshSlice {
		t.Fatalf("queued %d, %d per flush; want 1000, %d", len(w.refresh), w.refreshPer, minRefreshSlice)
	}
	// An unfinished refresh's rest (here 100 tenants, ten times
	// MaxDirty) heads the next one, and every tenant is queued once: no
	// full rewrite, the dearest write, just because Redis is behind.
	rest := slices.Clone(w.refresh[900:])
	w.refresh = w.refresh[900:]
	w.beginRefresh()
	if w.full || len(w.dirty) != 0 {
		t.Fatalf("behind refresh: full %v, %d dirty; want the rest queued", w.full, len(w.dirty))
	}
	if len(w.refresh) != 1000 || !slices.Equal(w.refresh[:100], rest) {
		t.Fatalf("behind refresh: queued %d, first 100 the rest: %v; want 1000 with the rest first", len(w.refresh), slices.Equal(w.refresh[:100], rest))
	}
	if uniq := slices.Compact(slices.Sorted(slices.Values(w.refresh))); len(uniq) != 1000 {
		t.Fatal("a tenant is queued twice")
	}
}

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
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// While the writer runs, no flag lapses: refreshes renew every tenant's
// key a slice per flush through several flag_ttl, and they renew it
// without rewriting it (the hash keeps the version of its first write),
// because its flags did not change. A refresh that did nothing would let
// the keys expire within one flag_ttl.
func TestSpreadRefreshKeepsEveryFlag(t *testing.T) {
	rdb, prefix := testRedis(t)
	keys := flags.Layout{Prefix: prefix}
	ctx := context.Background()
	const n, ttl = 500, 3 * time.Second
	src := newFlagged(n)
	cfg := Config{KeyPrefix: prefix, FlushInterval: 5 * time.Millisecond, FlagTTL: ttl,
		HeartbeatEvery: time.Second, MaxDirty: 10_000, BatchTenants: 100}
	w := New(rdb, src, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(rctx, time.Second) }()
	defer func() { cancel(); <-done }()

	read := func() []*redis.SliceCmd {
		cmds := make([]*redis.SliceCmd, n)
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, tn := range src.names {
				cmds[i] = p.HMGet(ctx, keys.TenantKey(tn), flags.AllModels, flags.VersionField)
			}
			return nil
		})
		return cmds
	}
	itest.Eventually(t, 30*time.Second, "every flag written", func() bool {
		for _, c := range read() {
			if v := c.Val(); len(v) != 2 || v[0] == nil {
				return false
			}
		}
		return true
	})
	first := map[string]any{}
	end := time.Now().Add(3 * ttl)
	for time.Now().Before(end) {
		for i, c := range read() {
			tn := src.names[i]
			v := c.Val()
			if len(v) != 2 || v[0] == nil {
				t.Fatalf("tenant %s: flag gone (%v)", tn, c.Err())
			}
			if _, ok := first[tn]; !ok {
				first[tn] = v[1]
			} else if v[1] != first[tn] {
				t.Fatalf("tenant %s: version went from %v to %v: an unchanged flag was rewritten", tn, first[tn], v[1])
			}
		}
		time.Sleep(50 * time.Millisecond) // pace the polls
	}
	if flushes, errs, _ := w.Stats(); errs > 0 || flushes < 10 {
		t.Errorf("%d flushes, %d failed: want refreshes spread over several flushes, none failed", flushes, errs)
	}
}

// A refresh announces only what changed: Checkers refetch a tenant on
// each announcement, and at 100,000 flagged tenants announcing every one
// every flag_ttl/3 cost each gateway 5,000 HGETALLs a second. Counted on
// the real channel: the full rewrite announces every tenant, a refresh
// with nothing changed none, a refresh after one tenant changed that one,
// and a refresh that finds a key gone (deleted by hand) writes it back
// and announces it.
func TestRefreshAnnouncesOnlyChanges(t *testing.T) {
	rdb, prefix := testRedis(t)
	keys := flags.Layout{Prefix: prefix}
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, keys.Channel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := sub.Channel()
	// announced returns the tenants announced since the last call: it
	// publishes a marker and reads up to it, so nothing is left in flight.
	announced := func() []string {
		t.Helper()
		const marker = "@marker 0"
		if err := rdb.Publish(ctx, keys.Channel(), marker).Err(); err != nil {
			t.Fatal(err)
		}
		var out []string
		timeout := time.After(30 * time.Second)
		for {
			select {
			case m := <-msgs:
				if m.Payload == marker {
					return out
				}
				tenant, _, err := flags.ParseChange(m.Payload)
				if err != nil {
					t.Fatalf("announcement %q: %v", m.Payload, err)
				}
				out = append(out, tenant)
			case <-timeout:
				t.Fatal("the marker never arrived")
			}
		}
	}
	const n = 300
	src := newFlagged(n)
	w := New(rdb, src, Config{KeyPrefix: prefix, FlushInterval: 5 * time.Millisecond, FlagTTL: time.Minute,
		HeartbeatEvery: time.Second, MaxDirty: 10_000, BatchTenants: 100}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	refresh := func() {
		t.Helper()
		w.beginRefresh()
		for w.refreshing() {
			if !w.Flush(ctx) {
				t.Fatal("refresh flush failed")
			}
		}
	}
	if !w.Flush(ctx) {
		t.Fatal("full rewrite failed")
	}
	if got := announced(); len(got) != n {
		t.Fatalf("the full rewrite announced %d tenants, want all %d", len(got), n)
	}
	key := keys.TenantKey(src.names[7])
	rdb.PExpire(ctx, key, 5*time.Second)
	refresh()
	if got := announced(); len(got) != 0 {
		t.Fatalf("a refresh with nothing changed announced %d tenants (%v), want none", len(got), got[:min(len(got), 5)])
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 5*time.Second {
		t.Fatalf("PTTL %v after the refresh, want the key's expiry renewed to flag_ttl", ttl)
	}

	src.until = src.until.Add(time.Hour) // every tenant's flag changes
	w.MarkDirty(src.names[3])
	if !w.Flush(ctx) {
		t.Fatal("flush failed")
	}
	if got := announced(); len(got) != 1 || got[0] != src.names[3] {
		t.Fatalf("a flush of one changed tenant announced %v, want [%s]", got, src.names[3])
	}
	refresh()
	if got := announced(); len(got) != n-1 {
		t.Fatalf("a refresh after %d tenants changed announced %d, want them", n-1, len(got))
	}

	gone := keys.TenantKey(src.names[11])
	rdb.Del(ctx, gone)
	refresh()
	if !w.Flush(ctx) { // the refresh found the key gone and marked it
		t.Fatal("flush failed")
	}
	if got := announced(); len(got) != 1 || got[0] != src.names[11] {
		t.Fatalf("a refresh that found a key gone announced %v, want [%s]", got, src.names[11])
	}
	if n, err := rdb.HLen(ctx, gone).Result(); err != nil || n != 2 {
		t.Fatalf("the deleted key has %d fields (%v), want its flag and version back", n, err)
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

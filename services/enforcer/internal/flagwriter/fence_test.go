package flagwriter

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// testRedis is a client of the real Redis and a prefix of the test's own,
// whose keys are removed when the test ends.
func testRedis(t *testing.T) (redis.UniversalClient, string) {
	t.Helper()
	rdb := redisconn.NewClient(itest.Redis(t))
	t.Cleanup(func() { rdb.Close() })
	prefix := itest.Unique(t, "sluice_test_") + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		_ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) })
	})
	return rdb, prefix
}

func fenceWriter(rdb redis.UniversalClient, prefix string, src Source) *Writer {
	return New(rdb, src, Config{KeyPrefix: prefix, FlagTTL: time.Minute, BatchTenants: 10, MaxDirty: 10, FlushInterval: time.Millisecond},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// A writer whose versions are older than what a tenant's hash holds (a
// leader that lost the lead while paused) has its write refused by Redis:
// the hash keeps the newer writer's flags, the refusal is counted, and
// the stale writer stops writing.
func TestOlderWriterIsFenced(t *testing.T) {
	rdb, prefix := testRedis(t)
	ctx := context.Background()
	key := flags.Layout{Prefix: prefix}.TenantKey("acme")
	now := time.Now().UnixMicro()

	newer := &mutableFlags{}
	newer.set("newer", "*")
	nw := fenceWriter(rdb, prefix, newer)
	nw.Lead(Grant{Floor: now + 1_000_000, Ceiling: now + 10_000_000})
	if !nw.Flush(ctx) {
		t.Fatal("the newer writer's flush failed")
	}

	older := &mutableFlags{} // its state: the tenant has no flags
	ow := fenceWriter(rdb, prefix, older)
	ow.Lead(Grant{Floor: now - 10_000_000, Ceiling: now})
	if ow.Flush(ctx) {
		t.Fatal("the older writer's flush reports success")
	}
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	f, err := flags.Decode(h["*"])
	if err != nil || f.Reason != "newer" {
		t.Fatalf("after the older writer's flush the hash is %v, want the newer writer's flag", h)
	}
	if n := ow.FencedWrites(); n != 1 {
		t.Errorf("fenced writes counted: %d, want 1", n)
	}
	if ow.Leading() {
		t.Error("the fenced writer still leads")
	}
	if ow.Newest() <= now+1_000_000 {
		t.Errorf("Newest() = %d, want above the newer writer's floor %d", ow.Newest(), now+1_000_000)
	}
}

// A lifted tenant leaves a tombstone — the version alone, expiring with
// flag_ttl — so that an older writer cannot bring the flags back, and a
// rewrite of the tombstone does not keep it for ever.
func TestLiftLeavesATombstone(t *testing.T) {
	rdb, prefix := testRedis(t)
	ctx := context.Background()
	key := flags.Layout{Prefix: prefix}.TenantKey("acme")
	src := &mutableFlags{}
	src.set("blocked", "*")
	w := fenceWriter(rdb, prefix, src)
	if !w.Flush(ctx) {
		t.Fatal("flush failed")
	}
	src.set("lifted")
	w.MarkDirty("acme")
	if !w.Flush(ctx) {
		t.Fatal("flush of the lift failed")
	}
	h, _ := rdb.HGetAll(ctx, key).Result()
	if len(h) != 1 || h[flags.VersionField] == "" {
		t.Fatalf("after the lift the hash is %v, want the version field alone", h)
	}
	rdb.PExpire(ctx, key, 5*time.Second)
	w.MarkDirty("acme")
	if !w.Flush(ctx) {
		t.Fatal("flush of the tombstone failed")
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 5*time.Second {
		t.Fatalf("PTTL %v after rewriting the tombstone, want its expiry kept (at most 5s)", ttl)
	}
	v, _ := rdb.HGet(ctx, key, flags.VersionField).Int64()

	stale := &mutableFlags{}
	stale.set("stale", "*")
	ow := fenceWriter(rdb, prefix, stale)
	ow.Lead(Grant{Floor: v - 10_000_000, Ceiling: v - 1})
	if ow.Flush(ctx) {
		t.Fatal("the older writer's flush over a tombstone reports success")
	}
	if h, _ := rdb.HGetAll(ctx, key).Result(); len(h) != 1 {
		t.Fatalf("an older writer brought flags back over the tombstone: %v", h)
	}
}

// Past its grant's deadline (the lease, less a margin, from the renewal's
// send time) a writer sends nothing: no flag, no heartbeat.
func TestNothingIsSentPastTheGrant(t *testing.T) {
	rdb, prefix := testRedis(t)
	ctx := context.Background()
	keys := flags.Layout{Prefix: prefix}
	src := &mutableFlags{}
	src.set("late", "*")
	w := fenceWriter(rdb, prefix, src)
	w.Lead(Grant{Ceiling: time.Now().Add(time.Hour).UnixMicro(), Until: time.Now().Add(-time.Millisecond)})
	if w.Flush(ctx) {
		t.Fatal("a flush past the grant reports success")
	}
	w.heartbeat(ctx)
	if n := rdb.Exists(ctx, keys.TenantKey("acme"), keys.HeartbeatKey()).Val(); n != 0 {
		t.Fatalf("%d keys written past the grant", n)
	}
}

// A Redis that lost its scripts (restarted, SCRIPT FLUSH) answers NOSCRIPT:
// the writes are sent again by their text, only those, so that none is
// refused as not newer than itself and the writer keeps leading.
func TestNoScriptResendsOnlyWhatWasRefused(t *testing.T) {
	rdb, prefix := testRedis(t)
	ctx := context.Background()
	src := &mutableFlags{}
	src.set("one", "*")
	w := fenceWriter(rdb, prefix, src)
	if !w.Flush(ctx) {
		t.Fatal("flush failed")
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	src.set("two", "*", "gpt-4o")
	w.MarkDirty("acme")
	if !w.Flush(ctx) {
		t.Fatal("flush after SCRIPT FLUSH failed")
	}
	if n := w.FencedWrites(); n != 0 || !w.Leading() {
		t.Fatalf("after a NOSCRIPT: %d writes fenced, leading %v; want 0 and true", n, w.Leading())
	}
	if h, _ := rdb.HGetAll(ctx, flags.Layout{Prefix: prefix}.TenantKey("acme")).Result(); len(h) != 3 {
		t.Fatalf("hash after the NOSCRIPT rewrite: %v, want @v, * and gpt-4o", h)
	}
}

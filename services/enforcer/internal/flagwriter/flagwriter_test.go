package flagwriter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

type noFlags struct{}

func (noFlags) Flags(string) map[string]*flags.Flag { return nil }
func (noFlags) Tenants() []string                   { return nil }

// The dirty set is bounded: past MaxDirty it turns into one full rewrite
// instead of growing.
func TestDirtySetIsBounded(t *testing.T) {
	w := New(nil, noFlags{}, Config{MaxDirty: 3}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.full = false // as after the first successful flush
	w.MarkDirty("a", "b", "c")
	if len(w.dirty) != 3 || w.full {
		t.Fatalf("dirty %v full %v", w.dirty, w.full)
	}
	w.MarkDirty("d")
	if len(w.dirty) != 0 || !w.full {
		t.Fatalf("overflow: dirty %v full %v", w.dirty, w.full)
	}
}

// A restarted enforcer's first (full) flush deletes flag hashes an earlier
// incarnation left behind, instead of letting them refuse a tenant until
// their TTL runs out; ReadStored, which a new leader merges first, finds
// every one of them. On a Redis Cluster the hashes sit on all three
// masters, so both must look at every master.
func TestFullRewriteClearsLeftoverFlags(t *testing.T) {
	for name, rc := range map[string]func(testing.TB) redisconn.Config{"redis": itest.Redis, "cluster": itest.RedisCluster} {
		t.Run(name, func(t *testing.T) {
			rdb := redisconn.NewClient(rc(t))
			defer rdb.Close()
			prefix := itest.Unique(t, "sluice_test_") + ":"
			keys := flags.Layout{Prefix: prefix}
			ctx := context.Background()
			t.Cleanup(func() { _ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) }) })
			stale := flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "hourly_tokens"})
			var ghosts []string
			masters := map[string]bool{}
			for i := range 12 {
				g := fmt.Sprintf("ghost%02d", i)
				ghosts = append(ghosts, g)
				if err := rdb.HSet(ctx, keys.TenantKey(g), "*", stale).Err(); err != nil {
					t.Fatal(err)
				}
				rdb.Expire(ctx, keys.TenantKey(g), time.Minute)
				if cc, ok := rdb.(*redis.ClusterClient); ok {
					m, err := cc.MasterForKey(ctx, keys.TenantKey(g))
					if err != nil {
						t.Fatal(err)
					}
					masters[m.Options().Addr] = true
				}
			}
			if name == "cluster" && len(masters) != 3 {
				t.Fatalf("the leftovers sit on %d masters; the test needs all three", len(masters))
			}
			w := New(rdb, noFlags{}, Config{KeyPrefix: prefix, FlagTTL: time.Minute, BatchTenants: 5, MaxDirty: 10},
				slog.New(slog.NewTextHandler(io.Discard, nil)))
			stored, err := w.ReadStored(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(stored) != len(ghosts) {
				t.Fatalf("ReadStored found %d of the %d hashes in Redis", len(stored), len(ghosts))
			}
			if !w.Flush(ctx) {
				t.Fatal("flush failed")
			}
			for _, g := range ghosts {
				if n, err := rdb.Exists(ctx, keys.TenantKey(g)).Result(); err != nil || n != 0 {
					t.Fatalf("leftover flag hash of %s still there (exists=%d, err=%v)", g, n, err)
				}
			}
		})
	}
}

// manyKeys is one tenant with n flags on API keys, all blacklisted.
type manyKeys struct{ n int }

func (m manyKeys) Flags(string) map[string]*flags.Flag {
	out := make(map[string]*flags.Flag, m.n)
	for i := range m.n {
		out[flags.KeyField(fmt.Sprintf("k%d", i))] = &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist}
	}
	return out
}
func (manyKeys) Tenants() []string { return []string{"big"} }

// A tenant with more flags than one Lua call can unpack (2,500 blacklisted
// keys) gets every one of them, and its hash the flag TTL.
func TestLargeTenantHashIsWrittenWhole(t *testing.T) {
	rdb := redisconn.NewClient(itest.Redis(t))
	defer rdb.Close()
	prefix := itest.Unique(t, "sluice_test_") + ":"
	keys := flags.Layout{Prefix: prefix}
	ctx := context.Background()
	t.Cleanup(func() { _ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) }) })
	w := New(rdb, manyKeys{n: 2500}, Config{KeyPrefix: prefix, FlagTTL: time.Minute, BatchTenants: 5, MaxDirty: 10},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !w.Flush(ctx) {
		t.Fatal("flush failed")
	}
	if n, err := rdb.HLen(ctx, keys.TenantKey("big")).Result(); err != nil || n != 2501 {
		t.Fatalf("HLEN = %d, %v; want 2,500 flags and the version", n, err)
	}
	if ttl := rdb.PTTL(ctx, keys.TenantKey("big")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("PTTL = %v, want within (0, 1m]", ttl)
	}
}

// mutableFlags is one tenant whose flag fields the test changes.
type mutableFlags struct {
	mu     sync.Mutex
	fields []string
	reason string
}

func (m *mutableFlags) set(reason string, fields ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fields, m.reason = fields, reason
}

func (m *mutableFlags) Flags(string) map[string]*flags.Flag {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]*flags.Flag{}
	for _, f := range m.fields {
		out[f] = &flags.Flag{State: flags.StateOpen, Kind: flags.KindManual, Reason: m.reason}
	}
	return out
}

func (m *mutableFlags) Tenants() []string { return []string{"acme"} }

// Rewriting a tenant whose fields did not change takes the light path
// (HSET and PEXPIRE, no script), and one whose values did not change
// either only a PEXPIRE; the hash must still end up exactly what the
// enforcer holds: new values, a renewed expiry, a field that went is
// gone, and a hash that vanished from Redis comes back.
func TestRewriteKeepsHashesExact(t *testing.T) {
	rdb := redisconn.NewClient(itest.Redis(t))
	defer rdb.Close()
	prefix := itest.Unique(t, "sluice_test_") + ":"
	key := flags.Layout{Prefix: prefix}.TenantKey("acme")
	ctx := context.Background()
	t.Cleanup(func() { _ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) }) })
	src := &mutableFlags{}
	src.set("one", "*", "gpt-4o")
	w := New(rdb, src, Config{KeyPrefix: prefix, FlagTTL: time.Minute, BatchTenants: 10, MaxDirty: 10},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	fields := func() map[string]string {
		t.Helper()
		h, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		delete(h, flags.VersionField)
		out := map[string]string{}
		for k, v := range h {
			f, err := flags.Decode(v)
			if err != nil {
				t.Fatalf("field %s: %v", k, err)
			}
			out[k] = f.Reason
		}
		return out
	}
	flush := func(what string) {
		t.Helper()
		if !w.Flush(ctx) {
			t.Fatalf("%s: flush failed", what)
		}
	}
	flush("full rewrite")
	// Same fields, new values, a shortened expiry to see it renewed.
	src.set("two", "*", "gpt-4o")
	rdb.PExpire(ctx, key, 5*time.Second)
	w.MarkDirty("acme")
	flush("same fields")
	if got := fields(); len(got) != 2 || got["*"] != "two" || got["gpt-4o"] != "two" {
		t.Fatalf("after a rewrite with the same fields: %v, want both fields with reason two", got)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 5*time.Second || ttl > time.Minute {
		t.Fatalf("PTTL %v after the rewrite, want the expiry renewed to within (5s, 1m]", ttl)
	}
	src.set("three", "*")
	w.MarkDirty("acme")
	flush("a field went")
	if got := fields(); len(got) != 1 || got["*"] != "three" {
		t.Fatalf("after gpt-4o's flag went: %v, want only * with reason three", got)
	}
	rdb.Del(ctx, key)
	w.MarkDirty("acme")
	// Unchanged: the first flush renews the expiry, finds the key gone
	// and marks the tenant for the whole write the next one makes.
	flush("hash vanished")
	flush("hash vanished, rewrite")
	if got := fields(); len(got) != 1 || got["*"] != "three" {
		t.Fatalf("after the hash vanished from Redis: %v, want * back", got)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("PTTL %v of the rewritten hash, want within (0, 1m]", ttl)
	}
}

package flagwriter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/gateway/flags"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

type noFlags struct{}

func (noFlags) Flags(string, time.Time, time.Duration) map[string]*flags.Flag { return nil }
func (noFlags) Tenants() []string                                             { return nil }

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

func (m manyKeys) Flags(_ string, now time.Time, ttl time.Duration) map[string]*flags.Flag {
	out := make(map[string]*flags.Flag, m.n)
	for i := range m.n {
		out[flags.KeyField(fmt.Sprintf("k%d", i))] = &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: now.Add(ttl)}
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

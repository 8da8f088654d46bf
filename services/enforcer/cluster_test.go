package enforcer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/itest/checkertest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// mastersOf returns the address of the master holding each key.
func mastersOf(t testing.TB, rdb redis.UniversalClient, keys ...string) map[string]int {
	t.Helper()
	cc := rdb.(*redis.ClusterClient)
	out := map[string]int{}
	for _, k := range keys {
		m, err := cc.MasterForKey(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		out[m.Options().Addr]++
	}
	return out
}

// startClusterChecker runs a Checker on rc that resyncs only at start
// (and on resubscription): anything it learns later comes by pub/sub.
func startClusterChecker(t testing.TB, rc redisconn.Config, prefix string) *checker.Checker {
	t.Helper()
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() })
	cfg := checker.DefaultConfig()
	cfg.KeyPrefix, cfg.MaxStaleness, cfg.ResyncInterval = prefix, 500*time.Millisecond, time.Hour
	return checkertest.Start(t, rdb, cfg)
}

// TestFlagsOnRedisCluster: the enforcer's flag writer and a gateway
// Checker, both connected to the real 3-master Redis Cluster, with tenants
// whose hashes sit on every master. Flags written before the Checker
// starts reach it by its resync (which must scan every master);
// flags raised and lifted afterwards reach it by pub/sub alone (its
// periodic resync is an hour away); fail modes and the heartbeat, on keys
// of their own slots, work too.
func TestFlagsOnRedisCluster(t *testing.T) {
	rc := itest.RedisCluster(t)
	cfg := testConfig(t)
	cfg.HeartbeatEvery = 100 * time.Millisecond
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	ctx := context.Background()
	if err := redisconn.Ready(rdb)(ctx); err != nil {
		t.Fatal(err)
	}

	var tenants, tenantKeys []string
	for i := range 30 {
		tenants = append(tenants, fmt.Sprintf("c%02d", i))
		tenantKeys = append(tenantKeys, keys.TenantKey(tenants[i]))
	}
	before, after := tenants[:15], tenants[15:]
	for name, ks := range map[string][]string{"tenants flagged first": tenantKeys[:15], "tenants flagged later": tenantKeys[15:]} {
		if m := mastersOf(t, rdb, ks...); len(m) != 3 {
			t.Fatalf("the %s' hashes sit on %v; the test needs all three masters", name, m)
		}
	}

	c, stop := startCore(t, cfg, rdb)
	now := time.Now()
	resets := map[string]*schemas.Signal{}
	for _, tn := range tenants {
		ex := exhausted(tn, "*")
		r := *ex
		r.ID, r.Kind = exhausted(tn, "*").ID, schemas.SignalPeriodReset
		resets[tn] = &r
		if len(resets) <= len(before) {
			c.handle(ex, now)
		}
	}
	itest.EventuallyNoError(t, within, "the first tenants' flags written", func() error {
		for _, k := range tenantKeys[:15] {
			if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 1 {
				return fmt.Errorf("%s: exists %d, %v", k, n, err)
			}
		}
		return nil
	})

	ch := startClusterChecker(t, rc, cfg.KeyPrefix)
	for _, tn := range before {
		if d := ch.Check(tn, "m", ""); d.Outcome != checker.Refused || d.Flag.Quota != string(schemas.QuotaDailyTokens) {
			t.Errorf("after the first resync %s is %+v, want refused on daily_tokens", tn, d)
		}
	}
	// The resync at start and the one at subscription; from now on only
	// pub/sub tells the Checker anything.
	itest.Eventually(t, within, "the Checker's subscription resync", func() bool { return ch.Resyncs() >= 2 })
	resyncs := ch.Resyncs()

	for _, tn := range after {
		c.handle(exhausted(tn, "*"), time.Now())
	}
	itest.EventuallyNoError(t, within, "flags raised after the resync reach the Checker", func() error {
		for _, tn := range after {
			if d := ch.Check(tn, "m", ""); d.Outcome != checker.Refused {
				return fmt.Errorf("%s: %+v", tn, d)
			}
		}
		return nil
	})
	lifted := append(append([]string{}, before[:6]...), after[:6]...)
	if m := mastersOf(t, rdb, func() (ks []string) {
		for _, tn := range lifted {
			ks = append(ks, keys.TenantKey(tn))
		}
		return ks
	}()...); len(m) != 3 {
		t.Fatalf("the lifted tenants' hashes sit on %v; the test needs all three masters", m)
	}
	for _, tn := range lifted {
		c.handle(resets[tn], time.Now())
	}
	itest.EventuallyNoError(t, within, "lifted flags reach the Checker", func() error {
		for _, tn := range lifted {
			if d := ch.Check(tn, "m", ""); !d.Allowed() {
				return fmt.Errorf("%s still refused: %+v", tn, d)
			}
			// What stays is the tombstone: the version field alone, which
			// fences off a late write of an earlier leader (docs/flags.md).
			if h, _ := rdb.HGetAll(ctx, keys.TenantKey(tn)).Result(); len(h) > 1 {
				return fmt.Errorf("%s: flags still in Redis: %v", tn, h)
			}
		}
		return nil
	})
	if got := ch.Resyncs(); got != resyncs {
		t.Fatalf("the Checker resynced %d times meanwhile; the test no longer shows that pub/sub alone carried the changes", got-resyncs)
	}
	if d := ch.Check(before[10], "m", ""); d.Outcome != checker.Refused {
		t.Fatalf("a tenant that was not lifted is %+v", d)
	}

	// Fail modes (a hash in its own slot) apply once the heartbeat stops.
	if d := ch.Check("strict", "m", ""); !d.Allowed() {
		t.Fatalf("fail-closed tenant refused while the enforcer lives: %+v", d)
	}
	stop()
	itest.Eventually(t, within, "stale view once the heartbeat stops", ch.Stale)
	if d := ch.Check("strict", "m", ""); d.Outcome != checker.RefusedStale {
		t.Fatalf("fail-closed tenant with a dead enforcer: %+v", d)
	}
}

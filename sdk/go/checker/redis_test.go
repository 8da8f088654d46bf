package checker

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

// fakeEnforcer writes flags the way the enforcer does, for Checker tests.
type fakeEnforcer struct {
	rdb  redis.UniversalClient
	keys flags.Layout
	v    int64
}

func (e *fakeEnforcer) set(t testing.TB, tenant string, fl map[string]*flags.Flag) {
	t.Helper()
	ctx := context.Background()
	e.v++
	_, err := e.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		key := e.keys.TenantKey(tenant)
		p.Del(ctx, key)
		if len(fl) > 0 {
			vals := []any{flags.VersionField, e.v}
			for k, f := range fl {
				vals = append(vals, k, flags.Encode(f))
			}
			p.HSet(ctx, key, vals...)
			p.PExpire(ctx, key, time.Minute)
		}
		p.Set(ctx, e.keys.VersionKey(), e.v, 0)
		p.Publish(ctx, e.keys.Channel(), flags.FormatChange(tenant, e.v))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// beat sets the heartbeat. It returns the error rather than failing the
// test, because the heartbeat goroutine below must not call t.Fatal.
func (e *fakeEnforcer) beat() error {
	return e.rdb.Set(context.Background(), e.keys.HeartbeatKey(), time.Now().UnixMilli(), 3*time.Second).Err()
}

// testEnforcer returns the real Redis's configuration and a fakeEnforcer
// writing to it under a prefix of the test's own, removed at its end.
func testEnforcer(t *testing.T) (redisconn.Config, *fakeEnforcer) {
	rcfg := itest.Redis(t)
	prefix := itest.Unique(t, "sluice_test:") + ":"
	rdb := redisconn.NewClient(rcfg)
	t.Cleanup(func() { rdb.Close() })
	cleanup(t, rdb, prefix)
	return rcfg, &fakeEnforcer{rdb: rdb, keys: flags.Layout{Prefix: prefix}}
}

// staleFastChecker is a Checker of rdb under prefix that turns stale
// half a second after the enforcer's last sign of life.
func staleFastChecker(t *testing.T, rdb redis.UniversalClient, prefix string) *Checker {
	t.Helper()
	cfg := DefaultConfig()
	cfg.KeyPrefix = prefix
	cfg.MaxStaleness = 500 * time.Millisecond
	c, err := New(rdb, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func cleanup(t testing.TB, rdb redis.UniversalClient, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		_ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) })
	})
}

func TestFollowsRedisResyncsAndFailsPerTenantWhenCut(t *testing.T) {
	rcfg, enf := testEnforcer(t)
	direct, prefix := enf.rdb, enf.keys.Prefix
	until := time.Now().Add(time.Hour)
	// A flag that exists before the Checker starts must be found by the
	// initial resync.
	enf.set(t, "early", map[string]*flags.Flag{"*": {State: flags.StateOpen, Kind: flags.KindManual, Until: until}})
	if err := enf.beat(); err != nil {
		t.Fatal(err)
	}
	direct.HSet(context.Background(), enf.keys.FailModeKey(), "strict", "closed", "*", "open")

	proxy := itest.NewProxy(t, rcfg.Addr)
	pcfg := rcfg
	pcfg.Addr = proxy.Addr()
	rdb := redisconn.NewClient(pcfg)
	defer rdb.Close()
	c := staleFastChecker(t, rdb, prefix)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	itest.Eventually(t, 30*time.Second, "initial resync", c.Synced)
	if d := c.Check("early", "m", ""); d.Allowed() {
		t.Fatal("flag written before start not loaded")
	}
	enf.set(t, "acme", map[string]*flags.Flag{"gpt-4o": {State: flags.StateOpen, Kind: flags.KindQuota, Quota: "daily_tokens", Until: until}})
	itest.Eventually(t, 30*time.Second, "announced flag", func() bool { return !c.Check("acme", "gpt-4o", "").Allowed() })
	enf.set(t, "acme", nil)
	itest.Eventually(t, 30*time.Second, "cleared flag", func() bool { return c.Check("acme", "gpt-4o", "").Allowed() })

	// Keep the heartbeat going while connected so the view stays fresh.
	stopBeat := make(chan struct{})
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		for {
			select {
			case <-stopBeat:
				return
			case <-time.After(50 * time.Millisecond):
				if err := enf.beat(); err != nil {
					t.Errorf("heartbeat: %v", err)
					return
				}
			}
		}
	}()
	itest.Eventually(t, 30*time.Second, "fresh view", func() bool { return !c.Stale() })
	if d := c.Check("strict", "m", ""); !d.Allowed() {
		t.Fatalf("fresh view refused: %+v", d)
	}

	proxy.Cut()
	itest.Eventually(t, 30*time.Second, "stale view after redis cut", c.Stale)
	if d := c.Check("strict", "m", ""); d.Outcome != RefusedStale {
		t.Fatalf("fail-closed tenant on a stale view: %+v", d)
	}
	if d := c.Check("loose", "m", ""); !d.Allowed() {
		t.Fatalf("fail-open tenant on a stale view: %+v", d)
	}
	// A change made while the Checker was cut off reaches it through the
	// resync that follows the resubscription.
	enf.set(t, "during-cut", map[string]*flags.Flag{"*": {State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until}})
	resyncs := c.Resyncs()
	proxy.Restore()
	itest.Eventually(t, 30*time.Second, "resync after reconnect", func() bool { return c.Resyncs() > resyncs })
	itest.Eventually(t, 30*time.Second, "change made during the cut", func() bool { return !c.Check("during-cut", "m", "").Allowed() })
	itest.Eventually(t, 30*time.Second, "fresh again", func() bool { return !c.Stale() })
	close(stopBeat)
	<-beatDone
}

// A Checker takes flag_ttl from the key the enforcer writes, at every
// resync; a value out of bounds, or no key (an older enforcer), leaves
// what it had. With the real Run: after the enforcer's last heartbeat a
// quota flag whose Until is an hour ahead lapses once the view is stale
// and flag_ttl (3 s, published) has passed since that beat, not before.
func TestStaleViewLapsesQuotaFlagByPublishedFlagTTL(t *testing.T) {
	_, enf := testEnforcer(t)
	rdb, prefix := enf.rdb, enf.keys.Prefix
	ctx := context.Background()
	c := staleFastChecker(t, rdb, prefix)
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{{"", flags.DefaultFlagTTL}, {"7000", 7 * time.Second}, {"12", 7 * time.Second}, {"soon", 7 * time.Second}, {"3000", 3 * time.Second}} {
		if tc.value != "" {
			rdb.Set(ctx, enf.keys.TTLKey(), tc.value, 0)
		}
		if err := c.resyncOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(c.flagTTL.Load()); got != tc.want {
			t.Fatalf("ttl key %q: flag ttl %v, want %v", tc.value, got, tc.want)
		}
	}

	until := time.Now().Add(time.Hour)
	enf.set(t, "initech", map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindQuota, Quota: "monthly_tokens", Until: until, ResetsAt: until}})
	if err := enf.beat(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(rctx) }()
	defer func() { cancel(); <-done }()
	itest.Eventually(t, 30*time.Second, "the flag loaded", func() bool { return !c.Check("initech", "m", "").Allowed() })
	// The enforcer dies: its heartbeat key goes, nothing else changes.
	rdb.Del(ctx, enf.keys.HeartbeatKey())
	lastBeat := time.Unix(0, c.lastFresh.Load())
	itest.Eventually(t, 30*time.Second, "a stale view", c.Stale)
	if d := c.Check("initech", "m", ""); d.Outcome != Refused && time.Since(lastBeat) < 3*time.Second {
		t.Fatalf("quota flag on a view stale for less than flag_ttl: %+v, want refused", d)
	}
	itest.Eventually(t, 30*time.Second, "the quota flag lapsed", func() bool { return c.Check("initech", "m", "").Allowed() })
	if since := time.Since(lastBeat); since < 3*time.Second {
		t.Fatalf("the quota flag lapsed %v after the last beat, before flag_ttl (3s)", since)
	}
}

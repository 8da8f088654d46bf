package enforcer

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/itest/checkertest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

const testPolicyYAML = `
defaults:
  fail_mode: open
tenants:
  strict:
    fail_mode: closed
`

func quietLog() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func testWatcher(t testing.TB) *policy.Watcher {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicyYAML), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return policy.Static(p)
}

// roundTrips counts what a client sends to Redis: one per command, one per
// pipeline (MULTI/EXEC included).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// testConfig is the default configuration under a private key prefix.
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.KeyPrefix = itest.Unique(t, "sluice_test:") + ":"
	cfg.ReplicaID = "test"
	return cfg
}

// testRedis returns a client of the shared Redis whose keys under prefix
// are deleted when the test ends. Cleanups run last-registered first: a
// core started after this call stops first (its last flush still reaches
// Redis), then the keys go, then the client closes. A deferred Close would
// run before all of them, and they would fail silently.
func testRedis(t testing.TB, rc redisconn.Config, prefix string) redis.UniversalClient {
	t.Helper()
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() })
	t.Cleanup(func() {
		ctx := context.Background()
		_ = flags.ScanKeys(ctx, rdb, prefix+"*", func(k string) { rdb.Del(ctx, k) })
	})
	return rdb
}

// testClickHouse opens the shared ClickHouse with every migration applied.
func testClickHouse(t testing.TB, chc chconn.Config) driver.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := chconn.Open(ctx, chc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := migrations.Apply(ctx, conn, quietLog()); err != nil {
		t.Fatal(err)
	}
	return conn
}

// startCore runs a core's flag writer and clock, as Run does, until the
// returned stop is called (or the test ends).
func startCore(t testing.TB, cfg Config, rdb redis.UniversalClient) (*core, func()) {
	t.Helper()
	c := newCore(cfg, rdb, testWatcher(t), quietLog())
	ctx, cancel := context.WithCancel(context.Background())
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.runWriter(ctx) })
	g.Go(func() error { return c.runClock(ctx) })
	var stopped atomic.Bool
	stop := func() {
		if stopped.CompareAndSwap(false, true) {
			cancel()
			if err := g.Wait(); err != nil {
				t.Errorf("core: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return c, stop
}

func startChecker(t testing.TB, rc redisconn.Config, prefix string, staleness time.Duration) *checker.Checker {
	t.Helper()
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() })
	cfg := checker.DefaultConfig()
	cfg.KeyPrefix = prefix
	cfg.MaxStaleness = staleness
	return checkertest.Start(t, rdb, cfg)
}

// within bounds every wait of these tests: generous, because a loaded
// machine shares two cores between several test binaries.
const within = 30 * time.Second

// writerSettled waits until the flag writer has finished every flush that
// work handled before the call causes. What Redis shows runs ahead of the
// writer's Stats (a flush is counted after Redis answered it), so tests that
// read Stats wait here first. Heartbeats come from the writer's own
// goroutine, between flushes: once one begins after the call, every flush
// in flight before it has been counted, and by the next one the flush
// ticks between them have written whatever was still dirty. It needs a
// short cfg.HeartbeatEvery.
func writerSettled(t testing.TB, rdb redis.UniversalClient, keys flags.Layout) {
	t.Helper()
	ctx := context.Background()
	since := time.Now().UnixMilli()
	for range 2 {
		itest.Eventually(t, within, "a heartbeat after the flag writes", func() bool {
			hb, _ := rdb.Get(ctx, keys.HeartbeatKey()).Int64()
			if hb > since {
				since = hb
				return true
			}
			return false
		})
	}
}

var signalSeq atomic.Int64

// exhausted is a hard quota_exhausted signal for tenant × model whose
// period ends in an hour.
func exhausted(tenant, model string) *schemas.Signal {
	now := time.Now().UTC().Truncate(time.Second)
	n := signalSeq.Add(1)
	return &schemas.Signal{ID: schemas.SignalID("test", tenant, model, time.Now().String(), strconv.FormatInt(n, 10)), Kind: schemas.SignalQuotaExhausted,
		Time: now, Tenant: tenant, Model: model, Quota: schemas.QuotaDailyTokens, Period: schemas.PeriodDay,
		PeriodStart: now.Add(-time.Hour), PeriodEnd: now.Add(time.Hour), Used: 1000, Limit: 1000, Unit: schemas.UnitTokens,
		Mode: schemas.ModeHard}
}

// serviceTestConfig is testConfig for a test that runs whole enforcers:
// their own consumer group too (their topics are itest.Topics).
func serviceTestConfig(t testing.TB) Config {
	cfg := testConfig(t)
	cfg.Group = itest.Unique(t, "enforcer_")
	return cfg
}

// adminTest is the set-up of a test that runs whole enforcers against
// the real services and acts through their admin API: a configuration of
// its own (consumer group, signals and admin topics, key prefix), a lease
// that changes hands within a second, the admin token "tok", and a client
// of the test's Redis keys.
type adminTest struct {
	cfg Config
	env platform.Env // Kafka, ClickHouse, Redis and signing keys
	rdb redis.UniversalClient
}

func newAdminTest(t *testing.T) *adminTest {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	a := &adminTest{cfg: serviceTestConfig(t)}
	a.cfg.HeartbeatEvery, a.cfg.LeaderLease = 500*time.Millisecond, time.Second
	a.cfg.Admin.Tokens = []adminapi.Token{{Name: "ops", SHA256: adminapi.HashToken("tok")}}
	a.env = platform.Env{Kafka: itest.Kafka(t), Topics: itest.Topics(t), ClickHouse: itest.ClickHouse(t), Redis: itest.Redis(t), SignalAuth: itest.SignalAuth(t)}
	testClickHouse(t, a.env.ClickHouse)
	a.rdb = testRedis(t, a.env.Redis, a.cfg.KeyPrefix)
	return a
}

// start runs an enforcer with its admin API on a fresh port and its own
// metrics registry; it returns a client of that API once the API answers,
// the registry, and the enforcer's stop. Called again after a stop, it is
// the same enforcer restarted.
func (a *adminTest) start(t *testing.T) (*adminapi.Client, *prometheus.Registry, func()) {
	t.Helper()
	cfg, env := a.cfg, a.env
	cfg.Admin.Listen = closedAddr(t)
	reg := prometheus.NewRegistry()
	env.Logger, env.Metrics = quietLog(), reg
	svc, err := New(cfg, env.Named("test"))
	stop := itest.RunService(t, svc, err)
	cl, err := adminapi.NewClient("http://"+cfg.Admin.Listen, "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	itest.EventuallyNoError(t, within, "admin API up", func() error { _, err := cl.Breakers(context.Background(), ""); return err })
	return cl, reg, stop
}

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

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/gateway/checker"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
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
	return cfg
}

func cleanupPrefix(t testing.TB, rdb *redis.Client, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
}

// startCore runs a core's flag writer and clock until the returned stop is
// called (or the test ends).
func startCore(t testing.TB, cfg Config, rdb *redis.Client) (*core, func()) {
	t.Helper()
	c := newCore(cfg, rdb, testWatcher(t), quietLog())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		go func() {
			tk := time.NewTicker(cfg.TickEvery)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tk.C:
					c.tick(now)
				}
			}
		}()
		_ = c.writer.Run(ctx, cfg.ShutdownGrace)
	}()
	var stopped atomic.Bool
	stop := func() {
		if stopped.CompareAndSwap(false, true) {
			cancel()
			<-done
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
	c, err := checker.New(rdb, cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "checker synced", c.Synced)
	return c
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
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

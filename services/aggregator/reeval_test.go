package aggregator_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/enforcer"
)

// signalWatch follows a signals topic from its start.
type signalWatch struct {
	t    testing.TB
	cl   *kgo.Client
	seen []schemas.Signal
}

func watchSignals(t testing.TB, e *env) *signalWatch {
	t.Helper()
	cl, err := kafkaconn.NewClient(e.kafka, kgo.ConsumeTopics(e.signals), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &signalWatch{t: t, cl: cl}
}

// has polls briefly and reports whether a signal matching pred arrived.
func (w *signalWatch) has(pred func(*schemas.Signal) bool) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		w.cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			var s schemas.Signal
			if err := schemas.DecodeSignal(r.Value, &s); err != nil {
				w.t.Errorf("undecodable signal: %v", err)
				return
			}
			w.seen = append(w.seen, s)
		})
		for i := range w.seen {
			if pred(&w.seen[i]) {
				return true
			}
		}
		return false
	}
}

func hourlyTier(tier int, dir schemas.Direction) func(*schemas.Signal) bool {
	return func(s *schemas.Signal) bool {
		return s.Kind == schemas.SignalTierCrossed && s.Tenant == "acme" && s.Model == "*" && s.Quota == schemas.QuotaHourlyTokens && s.Tier == tier && s.Direction == dir
	}
}

// runEnforcer runs a real enforcer on the test's signals topic, policy and
// a Redis prefix of its own, and returns whether a tenant has a flag.
func runEnforcer(t *testing.T, e *env) (flagged func(tenant string) bool) {
	t.Helper()
	rc := itest.Redis(t)
	cfg := enforcer.DefaultConfig()
	cfg.SignalsTopic, cfg.Group = e.signals, itest.Unique(t, "enf_")
	cfg.KeyPrefix = itest.Unique(t, "sluice_test:") + ":"
	cfg.Recover, cfg.Admin.Listen = false, ""
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() })
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, cfg.KeyPrefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	envp := platform.Env{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), Metrics: prometheus.NewRegistry(),
		Health: ops.NewHealth(), Kafka: e.kafka, Redis: rc, ClickHouse: e.ch, SignalAuth: testSignalAuth,
		Policy: platform.FileSource{File: e.policy, Reload: 100 * time.Millisecond}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- enforcer.Run(ctx, cfg, envp) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("enforcer: %v", err)
		}
	})
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	return func(tenant string) bool {
		// The version field alone is a lifted tenant's tombstone
		// (docs/flags.md): flagged means a flag besides it.
		n, err := rdb.HLen(context.Background(), keys.TenantKey(tenant)).Result()
		return err == nil && n > 1
	}
}

func writePolicy(t testing.TB, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestRaisedLimitUnblocksWithoutNewUsage: a tenant blocked at 100% of its
// hourly quota sends nothing more (the gateway refuses it); raising the
// limit tenfold in the policy file must take its tier down at once — the
// signal that closes the enforcer's quota breaker and resolves the alert —
// rewrite quota_state, and have a real enforcer lift the tenant's flag,
// within 5 s and with no new event.
func TestRaisedLimitUnblocksWithoutNewUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	e := setup(t)
	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 1000}\n")
	runInProcess(t, e, e.ch.Addr, nil)
	w := watchSignals(t, e)
	flagged := runEnforcer(t, e)

	now := time.Now().UTC()
	produce(t, e, []schemas.UsageEvent{{ID: "block", Time: now, Tenant: "acme", Model: "gpt-4o", PromptTokens: 1000}})
	itest.Eventually(t, 60*time.Second, "acme at 100% of its hourly quota", w.has(hourlyTier(100, schemas.DirectionUp)))
	itest.Eventually(t, 30*time.Second, "the enforcer to block acme", func() bool { return flagged("acme") })

	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 10000}\n")
	itest.Eventually(t, 5*time.Second, "a tier_crossed down after the limit was raised, with no new usage", w.has(hourlyTier(0, schemas.DirectionDown)))
	itest.Eventually(t, 5*time.Second, "the enforcer to lift acme's flag", func() bool { return !flagged("acme") })
	itest.Eventually(t, 5*time.Second, "quota_state at the raised limit, tier 0", func() bool {
		var limit float64
		var tier uint16
		err := e.conn.QueryRow(context.Background(), `SELECT quota_limit, tier FROM quota_state FINAL
			WHERE tenant = 'acme' AND model = '*' AND quota = 'hourly_tokens' ORDER BY period_start DESC LIMIT 1`).Scan(&limit, &tier)
		return err == nil && limit == 10000 && tier == 0
	})
}

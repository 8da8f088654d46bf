package aggregator_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator"
)

func TestConfigValidateNamesFieldAndLimit(t *testing.T) {
	if err := aggregator.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	c := aggregator.DefaultConfig()
	c.BatchEvents = 0
	c.DedupCapacity = 10
	c.IdleEvictAfter = time.Minute
	c.SpikeMultiplier = 1
	err := c.Validate()
	for _, want := range []string{"batch_events: 0 is outside 1..1000000", "dedup_capacity: 10 is outside 1000..50000000",
		"idle_evict_after: 1m0s is outside 5m..744h", "spike_multiplier: 1 is outside 1.5..1000"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

// running is an in-process aggregator for tests that need its metrics.
type running struct {
	reg  *prometheus.Registry
	stop func() error
}

func runInProcess(t testing.TB, e *env, chAddr string, mutate func(*aggregator.Config)) *running {
	t.Helper()
	cfg := aggregator.DefaultConfig()
	cfg.Group = e.group
	cfg.FlushInterval, cfg.SessionTimeout = 100*time.Millisecond, 6*time.Second
	cfg.RetryMin, cfg.RetryMax = 50*time.Millisecond, 300*time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	ch := e.ch
	ch.Addr = chAddr
	ch.DialTimeout = time.Second
	reg := prometheus.NewRegistry()
	envp := platform.Env{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), Metrics: reg, Health: ops.NewHealth(), Kafka: e.kafka, ClickHouse: ch,
		Topics:     platform.Topics{Usage: e.topic, Signals: e.signals, Admin: e.admin},
		SignalAuth: testSignalAuth, Policy: platform.FileSource{File: e.policy, Reload: 100 * time.Millisecond}}
	svc, err := aggregator.New(cfg, envp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var (
		once    sync.Once
		stopErr error
	)
	r := &running{reg: reg, stop: func() error {
		once.Do(func() { cancel(); stopErr = <-done })
		return stopErr
	}}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func (r *running) metric(t testing.TB, name, label string) float64 {
	t.Helper()
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					match = true
				}
			}
			if match {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// histogramCounts returns the sample count of histogram name by the value
// of its one label.
func (r *running) histogramCounts(t testing.TB, name string) map[string]uint64 {
	t.Helper()
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				out[l.GetValue()] += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return out
}

func caughtUp(t testing.TB, e *env) func() bool {
	return func() bool {
		done, end := committed(t, e)
		return end > 0 && done == end
	}
}

// TestClickHouseOutageStopsCommits: while ClickHouse is unreachable the
// aggregator keeps retrying and commits nothing past what it stored; when
// ClickHouse returns, everything is written and counted once.
func TestClickHouseOutageStopsCommits(t *testing.T) {
	e := integrationEnv(t, "")
	proxy := itest.NewProxy(t, e.ch.Addr)
	r := runInProcess(t, e, proxy.Addr(), nil)

	base := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	evs, final := workload(3000, base)
	produce(t, e, evs[:len(evs)/2])
	itest.Eventually(t, 90*time.Second, "first half consumed", caughtUp(t, e))
	before, _ := committed(t, e)

	proxy.Cut()
	produce(t, e, evs[len(evs)/2:])
	itest.Eventually(t, 60*time.Second, "failed writes to be retried", func() bool {
		return r.metric(t, "sluice_aggregator_flush_errors_total", "clickhouse write") >= 3
	})
	if now, _ := committed(t, e); now != before {
		t.Fatalf("offsets moved from %d to %d while ClickHouse was down", before, now)
	}
	proxy.Restore()
	itest.Eventually(t, 90*time.Second, "second half consumed after ClickHouse returned", caughtUp(t, e))
	if err := r.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pol, err := policy.Load(e.policy)
	if err != nil {
		t.Fatal(err)
	}
	truth := loadDistinct(t, ctx, e.conn, pol)
	if len(truth) != len(final) {
		t.Errorf("ClickHouse holds %d distinct events, %d were sent", len(truth), len(final))
	}
	checkCounters(t, ctx, e.conn, truth, pol)
}

// TestPolicyHotReload: a broken policy file is refused (the previous policy
// stays in force and the failure is counted); a valid edit takes effect
// without a restart.
func TestPolicyHotReload(t *testing.T) {
	e := integrationEnv(t, "tenants:\n  acme:\n    models:\n      \"*\": {daily_tokens: 1000}\n")
	r := runInProcess(t, e, e.ch.Addr, nil)

	n := 0
	send := func() {
		n++
		ev := schemas.UsageEvent{ID: fmt.Sprintf("e%d", n), Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 10}
		produce(t, e, []schemas.UsageEvent{ev})
	}
	limitIs := func(want float64) func() bool {
		return func() bool {
			send()
			itest.Eventually(t, 60*time.Second, "event consumed", caughtUp(t, e))
			var limit float64
			err := e.conn.QueryRow(context.Background(), "SELECT argMax(quota_limit, version) FROM quota_state WHERE tenant = 'acme' AND quota = 'daily_tokens'").Scan(&limit)
			return err == nil && limit == want
		}
	}
	itest.Eventually(t, 60*time.Second, "the initial limit in quota_state", limitIs(1000))

	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {daily_tokens: -5}\n")
	itest.Eventually(t, 30*time.Second, "the broken reload to be counted", func() bool {
		return r.metric(t, "sluice_aggregator_policy_reload_failures_total", "") >= 1
	})
	if !limitIs(1000)() {
		t.Fatal("after a broken reload the previous policy must stay in force")
	}

	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {daily_tokens: 2000}\n")
	itest.Eventually(t, 60*time.Second, "the new limit to take effect", limitIs(2000))
}

// TestSignalsDoNotWaitForClickHouse: a ClickHouse outage must not switch
// enforcement off. While ClickHouse is unreachable, events keep being read
// and the tenant they push past its quota gets its quota_exhausted signal;
// offsets still stay where ClickHouse last stored, and once ClickHouse
// returns everything is stored and counted once.
func TestSignalsDoNotWaitForClickHouse(t *testing.T) {
	e := integrationEnv(t, "defaults:\n  timezone: UTC\n  models:\n    \"*\": {hourly_tokens: 10000}\n")
	proxy := itest.NewProxy(t, e.ch.Addr)
	r := runInProcess(t, e, proxy.Addr(), nil)

	now := time.Now().UTC()
	n := 0
	send := func(tenant string, count int, tokens int64) {
		evs := make([]schemas.UsageEvent, count)
		for i := range evs {
			n++
			evs[i] = schemas.UsageEvent{ID: fmt.Sprintf("e%d", n), Time: now, Tenant: tenant, Model: "gpt-4o", PromptTokens: tokens}
		}
		produce(t, e, evs)
	}
	send("warm", 1, 10)
	itest.Eventually(t, 90*time.Second, "the warm-up event stored and committed", caughtUp(t, e))
	before, _ := committed(t, e)

	proxy.Cut()
	// The first wave is flushed into a ClickHouse write that keeps failing;
	// the second arrives while that write is being retried.
	send("acme", 5, 1000)
	itest.Eventually(t, 60*time.Second, "the write of the first wave to be retried", func() bool {
		return r.metric(t, "sluice_aggregator_flush_errors_total", "clickhouse write") >= 2
	})
	send("acme", 6, 1000)

	sig, err := kafkaconn.NewClient(e.kafka, kgo.ConsumeTopics(e.signals), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer sig.Close()
	exhausted := false
	itest.Eventually(t, 60*time.Second, "quota_exhausted for acme while ClickHouse is down", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		sig.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			var s schemas.Signal
			if schemas.DecodeSignal(rec.Value, &s) == nil && s.Kind == schemas.SignalQuotaExhausted && s.Tenant == "acme" {
				exhausted = true
			}
		})
		return exhausted
	})
	if now, _ := committed(t, e); now != before {
		t.Fatalf("offsets moved from %d to %d while ClickHouse was down", before, now)
	}

	proxy.Restore()
	itest.Eventually(t, 90*time.Second, "everything stored once ClickHouse returned", caughtUp(t, e))
	var used float64
	if err := e.conn.QueryRow(context.Background(), "SELECT used FROM quota_state FINAL WHERE tenant = 'acme' AND model = '*' AND quota = 'hourly_tokens'").Scan(&used); err != nil || used != 11000 {
		t.Errorf("acme hourly_tokens used %v (%v), want 11000", used, err)
	}
}

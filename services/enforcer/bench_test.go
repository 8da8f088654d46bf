package enforcer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// BenchmarkSignalToVisible measures checker_signal_to_visible_p50_ms and
// checker_signal_to_visible_p99_ms: from the enforcer handling a hard
// quota_exhausted signal to an in-process Checker (subscribed through the
// real Redis on loopback) refusing that tenant, one signal at a time, each
// for a new tenant, default 5 ms coalescing interval.
func BenchmarkSignalToVisible(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the real Redis")
	}
	rc := itest.Redis(b)
	cfg := testConfig(b)
	rdb := testRedis(b, rc, cfg.KeyPrefix)
	c, _ := startCore(b, cfg, rdb)
	ch := startChecker(b, rc, cfg.KeyPrefix, 10*time.Second)
	n := min(b.N, 2000) // each sample creates a tenant; bound Redis garbage
	lat := make([]time.Duration, 0, n)
	b.ResetTimer()
	for i := range n {
		tenant := fmt.Sprintf("bench-%d", i)
		start := time.Now()
		c.handle(exhausted(tenant, "*"), start)
		deadline := start.Add(30 * time.Second)
		for ch.Check(tenant, "m", "").Allowed() {
			if time.Now().After(deadline) {
				b.Fatalf("flag for %s not visible after 30s", tenant)
			}
			time.Sleep(100 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(ms(0.50), "checker_signal_to_visible_p50_ms")
	b.ReportMetric(ms(0.99), "checker_signal_to_visible_p99_ms")
}

// BenchmarkBurst10kSignals measures enforcer_redis_roundtrips_per_10k_signals:
// the pipelined Redis writes the enforcer makes for a burst of 10,000 hard
// quota signals spread over 1,000 tenants × 10 models, handled back to back
// with the default 5 ms coalescing interval, against the real Redis.
func BenchmarkBurst10kSignals(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the real Redis")
	}
	rc := itest.Redis(b)
	cfg := testConfig(b)
	// A short heartbeat lets writerSettled tell when the counts are final;
	// heartbeats are not flushes, so they do not enter the metric.
	cfg.HeartbeatEvery = 50 * time.Millisecond
	cfg.FlagTTL = 10 * time.Minute
	rdb := testRedis(b, rc, cfg.KeyPrefix)
	c, _ := startCore(b, cfg, rdb)
	ctx := context.Background()
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	itest.Eventually(b, within, "initial write", func() bool { return rdb.Exists(ctx, cfg.KeyPrefix+"epoch").Val() == 1 })
	writerSettled(b, rdb, keys)
	const signals, tenants = 10_000, 1000
	var total int64
	b.ResetTimer()
	for round := range b.N {
		before, _, _ := c.writer.Stats()
		now := time.Now()
		for i := range signals {
			c.handle(exhausted(fmt.Sprintf("r%d-t%04d", round, i%tenants), fmt.Sprintf("m%d", i/tenants)), now)
		}
		last := keys.TenantKey(fmt.Sprintf("r%d-t%04d", round, tenants-1))
		itest.Eventually(b, within, "burst written", func() bool { return rdb.HLen(ctx, last).Val() == 1+signals/tenants })
		writerSettled(b, rdb, keys)
		after, _, _ := c.writer.Stats()
		total += after - before
	}
	b.StopTimer()
	b.ReportMetric(float64(total)/float64(b.N), "enforcer_redis_roundtrips_per_10k_signals")
}

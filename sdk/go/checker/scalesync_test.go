package checker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// The enforcer's defaults the refresh figures assume: flag_ttl 60 s, so a
// refresh of every flagged tenant every 20 s, spread over 10 s in slices
// of at least 100 tenants, one slice per 5 ms flush (see
// services/enforcer/internal/flagwriter).
const (
	scaleFlagTTL       = time.Minute
	scaleFlushInterval = 5 * time.Millisecond
	scaleMinSlice      = 100
)

// BenchmarkScaleCheckerSync measures what keeping n flagged tenants in
// step with Redis costs one Checker, against the real Redis under a unique
// prefix, for the sizes of the growth curves (SLUICE_SCALE_SIZES=1000,10000
// for fewer). Every tenant has one tenant-wide quota flag, written as the
// enforcer writes it.
//
//   - scale_checker_resync_ms_<n>, _resync_cpu_ms_<n> and
//     _resync_bytes_per_flagged_tenant_<n>: one full resync (SCAN, then an
//     HGETALL of every tenant, then the new tables), wall time, the
//     process's CPU time and the bytes read from and written to Redis. A
//     Checker does one at start, after every reconnection and every
//     resync_interval (30 s). _resync_redis_cpu_ms_<n> is Redis's CPU
//     meanwhile (INFO cpu; the shared Redis counts other clients too).
//   - scale_checker_refresh_ms_<n>, _refresh_cpu_ms_<n> and
//     _refresh_bytes_per_flagged_tenant_<n>: refetching every tenant in the
//     slices an enforcer's refresh announces them in — what every refresh
//     (every flag_ttl/3 = 20 s) cost before the enforcer stopped announcing
//     unchanged tenants (issue 37; scale_enforcer_refresh_announcements_<n>
//     counts what it announces now: none), and what a burst changing every
//     flag costs. Past 60 s of measuring (SLUICE_SCALE_REFRESH_LIMIT) the
//     rest is extrapolated from the tenants done. _refresh_redis_cpu_ms_<n>:
//     Redis's CPU.
//   - scale_checker_sync_cpu_share_<n>: the resync's CPU over the interval
//     it recurs in, as a share of one core: what a gateway spends on
//     following the flags while none changes (the refresh adds nothing).
func BenchmarkScaleCheckerSync(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the real Redis")
	}
	limit := time.Minute
	if v := os.Getenv("SLUICE_SCALE_REFRESH_LIMIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("SLUICE_SCALE_REFRESH_LIMIT=%q is not a positive duration", v)
		}
		limit = d
	}
	// SLUICE_CHECKER_REBUILD=1: every refetch copies the shards it
	// touches, as before the in-place replacement (see rebuildShards).
	rebuildShards = os.Getenv("SLUICE_CHECKER_REBUILD") == "1"
	defer func() { rebuildShards = false }()
	for _, n := range itest.ScaleSizes(b, scaleSizes...) {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			rcfg := itest.Redis(b)
			direct := redisconn.NewClient(rcfg)
			defer direct.Close()
			prefix := itest.Unique(b, "sluice_bench_") + ":"
			keys := flags.Layout{Prefix: prefix}
			defer func() {
				if err := flags.UnlinkKeys(context.Background(), direct, prefix+"*"); err != nil {
					b.Error(err)
				}
			}()
			names := writeFlagged(b, direct, keys, n)

			var counted byteCounter
			rdb := redisconn.NewClient(rcfg)
			defer rdb.Close()
			rdb.AddHook(&counted)
			cfg := DefaultConfig()
			cfg.KeyPrefix = prefix
			ctx := context.Background()
			for range b.N { // the figures are of the last round
				c, err := New(rdb, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					b.Fatal(err)
				}
				var resyncErr error
				resync := measureSync(b, direct, &counted, func() bool {
					resyncErr = c.resyncOnce(ctx)
					return true
				})
				if resyncErr != nil {
					b.Fatalf("resync of %d tenants: %v", n, resyncErr)
				}
				if got := c.Tenants(); got != n {
					b.Fatalf("resync found %d tenants, want %d", got, n)
				}

				per := max((n*int(scaleFlushInterval)+int(scaleFlagTTL/6)-1)/int(scaleFlagTTL/6), scaleMinSlice)
				done := 0
				start := time.Now()
				refresh := measureSync(b, direct, &counted, func() bool {
					part := names[done:min(done+per, n)]
					updates, err := c.fetch(ctx, part)
					if err != nil {
						b.Fatalf("refetch of %d tenants: %v", len(part), err)
					}
					c.apply(updates, 0, false)
					done += len(part)
					return done == n || time.Since(start) > limit
				})
				if c.Tenants() != n {
					b.Fatalf("after the refresh %d tenants, want %d", c.Tenants(), n)
				}
				refresh = refresh.scaled(float64(n) / float64(done))

				b.ReportMetric(ms(resync.wall), fmt.Sprintf("scale_checker_resync_ms_%d", n))
				b.ReportMetric(ms(resync.cpu), fmt.Sprintf("scale_checker_resync_cpu_ms_%d", n))
				b.ReportMetric(float64(resync.bytes)/float64(n), fmt.Sprintf("scale_checker_resync_bytes_per_flagged_tenant_%d", n))
				b.ReportMetric(ms(resync.redisCPU), fmt.Sprintf("scale_checker_resync_redis_cpu_ms_%d", n))
				b.ReportMetric(ms(refresh.wall), fmt.Sprintf("scale_checker_refresh_ms_%d", n))
				b.ReportMetric(ms(refresh.cpu), fmt.Sprintf("scale_checker_refresh_cpu_ms_%d", n))
				b.ReportMetric(float64(refresh.bytes)/float64(n), fmt.Sprintf("scale_checker_refresh_bytes_per_flagged_tenant_%d", n))
				b.ReportMetric(ms(refresh.redisCPU), fmt.Sprintf("scale_checker_refresh_redis_cpu_ms_%d", n))
				share := resync.cpu.Seconds() / cfg.ResyncInterval.Seconds()
				b.ReportMetric(share, fmt.Sprintf("scale_checker_sync_cpu_share_%d", n))
			}
		})
	}
}

// syncCost is what some Redis work cost the process and Redis.
type syncCost struct {
	wall, cpu, redisCPU time.Duration
	bytes               int64
}

func (s syncCost) scaled(f float64) syncCost {
	sc := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	return syncCost{wall: sc(s.wall), cpu: sc(s.cpu), redisCPU: sc(s.redisCPU), bytes: int64(float64(s.bytes) * f)}
}

// measureSync runs step until it returns true and returns the wall time,
// the process's CPU time (user + system), Redis's (INFO cpu: the shared
// Redis counts its other clients too) and the bytes through counted.
func measureSync(b *testing.B, rdb redis.UniversalClient, counted *byteCounter, step func() (done bool)) syncCost {
	cpu0, redis0, bytes0, start := itest.ProcessCPU(), itest.RedisCPU(b, rdb), counted.n.Load(), time.Now()
	for !step() {
	}
	return syncCost{wall: time.Since(start), cpu: itest.ProcessCPU() - cpu0, redisCPU: itest.RedisCPU(b, rdb) - redis0, bytes: counted.n.Load() - bytes0}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// writeFlagged writes n tenants with one flag each under keys, as the
// enforcer writes them, 1,000 per pipeline, with an expiry long enough for
// the benchmark; it returns their names.
func writeFlagged(b *testing.B, rdb redis.UniversalClient, keys flags.Layout, n int) []string {
	ctx := context.Background()
	now := time.Now()
	value := flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "monthly_tokens", Period: "month",
		Until: now.Add(scaleFlagTTL), Limit: 1e6, Used: 1.0000125e6, ResetsAt: now.Add(30 * 24 * time.Hour)})
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%07d", i)
	}
	version := now.UnixMicro()
	for i := 0; i < n; i += 1000 {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, t := range names[i:min(i+1000, n)] {
				p.HSet(ctx, keys.TenantKey(t), flags.VersionField, version, flags.AllModels, value)
				p.PExpire(ctx, keys.TenantKey(t), 30*time.Minute)
			}
			return nil
		})
		if err != nil {
			b.Fatalf("write flags %d..: %v", i, err)
		}
	}
	if err := rdb.Set(ctx, keys.VersionKey(), version, 0).Err(); err != nil {
		b.Fatal(err)
	}
	return names
}

// byteCounter is a go-redis hook counting the bytes of every connection
// it dials, both ways.
type byteCounter struct{ n atomic.Int64 }

func (h *byteCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countedConn{Conn: conn, n: &h.n}, nil
	}
}

func (h *byteCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *byteCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

package flagwriter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// flagged is a Source of n tenants with one hard-quota flag each, Until
// the end of a month-long period, as the enforcer's table writes it. It
// leaves resets_at out, as the figures before issue 37 did: the 13 more
// bytes of a real quota flag take a tenant's hash into the next allocator
// size class (MEMORY USAGE 152 → 320 bytes on Redis 7.0).
type flagged struct {
	names []string
	until time.Time
}

func newFlagged(n int) *flagged {
	f := &flagged{names: make([]string, n), until: time.Now().Add(30 * 24 * time.Hour)}
	for i := range f.names {
		f.names[i] = fmt.Sprintf("scale-tenant-%07d", i)
	}
	return f
}

func (f *flagged) Tenants() []string { return f.names }
func (f *flagged) Flags(string) map[string]*flags.Flag {
	return map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindQuota, Quota: "monthly_tokens", Period: "month", Until: f.until}}
}

// BenchmarkScaleEnforcer measures the enforcer's flag writes growing with
// the flagged tenants: for 1,000, 10,000, 100,000 and 1,000,000 tenants
// with one flag each (SLUICE_SCALE_SIZES=1000,10000 for fewer), against
// the real Redis under a unique prefix, default batch_tenants (1,000) and
// flag_ttl (60 s):
//
//   - scale_enforcer_rewrite_ms_<n>: the full rewrite of every flag (what
//     a start, a takeover or a Redis that lost its data costs);
//   - scale_enforcer_redis_bytes_per_flagged_tenant_<n>: Redis used_memory
//     (INFO memory) after that write minus before, over n (the Redis is
//     shared: other clients' writes meanwhile are counted too);
//   - scale_enforcer_refresh_ms_<n>: the Redis writes of one refresh of
//     every flag, which runs every flag_ttl/3 (20 s), summed;
//   - scale_enforcer_refresh_max_flush_ms_<n>: the longest single flush of
//     that refresh — a flag that changes meanwhile waits for it;
//   - scale_enforcer_refresh_share_<n>: the refresh's summed time over the
//     flag_ttl/3 it recurs in (1: the writer does nothing else);
//   - scale_enforcer_refresh_cpu_ms_<n> and _refresh_redis_cpu_ms_<n>: the
//     CPU time of that refresh in the enforcer (this process, user and
//     system) and in Redis (INFO cpu, which counts the other clients of
//     the shared Redis too): where its time goes;
//   - scale_enforcer_refresh_announcements_<n>: the change announcements
//     that refresh published, counted by a subscriber on the channel: each
//     is one HGETALL for every gateway's Checker.
//
// SLUICE_ENFORCER_REWRITE_UNCHANGED=1 rewrites and announces unchanged
// tenants at every refresh, as when Until was capped at flag_ttl ahead
// (see unchangedRewritten): the before of the same binary.
func BenchmarkScaleEnforcer(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the real Redis")
	}
	sizes := itest.ScaleSizes(b, 1_000, 10_000, 100_000, 1_000_000)
	// SLUICE_ENFORCER_SCRIPT_ONLY=1: every hash write takes the script,
	// as before the light path for unchanged fields (see scriptOnly).
	scriptOnly = os.Getenv("SLUICE_ENFORCER_SCRIPT_ONLY") == "1"
	unchangedRewritten = os.Getenv("SLUICE_ENFORCER_REWRITE_UNCHANGED") == "1"
	defer func() { scriptOnly, unchangedRewritten = false, false }()
	for _, n := range sizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			rdb := redisconn.NewClient(itest.Redis(b))
			defer rdb.Close()
			prefix := itest.Unique(b, "sluice_bench_") + ":"
			ctx := context.Background()
			defer unlink(b, rdb, prefix)
			cfg := Config{KeyPrefix: prefix, FlushInterval: 5 * time.Millisecond, FlagTTL: time.Minute,
				HeartbeatEvery: time.Second, MaxDirty: 100_000, BatchTenants: 1000}
			w := New(rdb, newFlagged(n), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			counter := countAnnouncements(b, rdb, flags.Layout{Prefix: prefix}.Channel())
			for range b.N { // the figures are of the last round
				mem0 := usedMemory(b, rdb)
				start := time.Now()
				if !w.Flush(ctx) {
					b.Fatal("full rewrite failed")
				}
				rewrite := time.Since(start)
				// Read the rewrite's announcements first: while they wait
				// in the subscriber's output buffer, used_memory counts them.
				counter.take(b)
				mem1 := usedMemory(b, rdb)

				w.beginRefresh()
				var total, longest time.Duration
				cpu0, redis0 := itest.ProcessCPU(), itest.RedisCPU(b, rdb)
				for w.refreshing() {
					fs := time.Now()
					if !w.Flush(ctx) {
						b.Fatal("refresh flush failed")
					}
					d := time.Since(fs)
					total += d
					longest = max(longest, d)
				}
				cpu, redisCPUUsed := itest.ProcessCPU()-cpu0, itest.RedisCPU(b, rdb)-redis0
				b.ReportMetric(float64(counter.take(b)), fmt.Sprintf("scale_enforcer_refresh_announcements_%d", n))
				b.ReportMetric(float64(rewrite.Microseconds())/1000, fmt.Sprintf("scale_enforcer_rewrite_ms_%d", n))
				b.ReportMetric(float64(cpu.Microseconds())/1000, fmt.Sprintf("scale_enforcer_refresh_cpu_ms_%d", n))
				b.ReportMetric(float64(redisCPUUsed.Microseconds())/1000, fmt.Sprintf("scale_enforcer_refresh_redis_cpu_ms_%d", n))
				b.ReportMetric(float64(mem1-mem0)/float64(n), fmt.Sprintf("scale_enforcer_redis_bytes_per_flagged_tenant_%d", n))
				b.ReportMetric(float64(total.Microseconds())/1000, fmt.Sprintf("scale_enforcer_refresh_ms_%d", n))
				b.ReportMetric(float64(longest.Microseconds())/1000, fmt.Sprintf("scale_enforcer_refresh_max_flush_ms_%d", n))
				b.ReportMetric(total.Seconds()/(cfg.FlagTTL/3).Seconds(), fmt.Sprintf("scale_enforcer_refresh_share_%d", n))
				// Start the next round from an empty prefix.
				unlink(b, rdb, prefix)
				w = New(rdb, newFlagged(n), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			}
		})
	}
}

// announcementCounter counts the messages on a channel.
type announcementCounter struct {
	rdb     redis.UniversalClient
	channel string
	counted chan int // the count up to each marker
}

// marker is published to delimit a count; it is not a change.
const marker = "@marker 0"

// countAnnouncements subscribes to channel until the benchmark ends.
func countAnnouncements(b *testing.B, rdb redis.UniversalClient, channel string) *announcementCounter {
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, channel)
	if _, err := sub.Receive(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sub.Close() })
	c := &announcementCounter{rdb: rdb, channel: channel, counted: make(chan int, 1)}
	go func() {
		n := 0
		for m := range sub.Channel(redis.WithChannelSize(10_000)) {
			if m.Payload == marker {
				c.counted <- n
				n = 0
				continue
			}
			n++
		}
	}()
	return c
}

// take returns the messages counted since the last take.
func (c *announcementCounter) take(b *testing.B) int {
	if err := c.rdb.Publish(context.Background(), c.channel, marker).Err(); err != nil {
		b.Fatal(err)
	}
	select {
	case n := <-c.counted:
		return n
	case <-time.After(time.Minute):
		b.Fatal("the marker never arrived")
		return 0
	}
}

// unlink removes every key under prefix.
func unlink(b *testing.B, rdb redis.UniversalClient, prefix string) {
	if err := flags.UnlinkKeys(context.Background(), rdb, prefix+"*"); err != nil {
		b.Error(err)
	}
}

// usedMemory is Redis's used_memory from INFO memory.
func usedMemory(b *testing.B, rdb redis.UniversalClient) int64 {
	info, err := rdb.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		b.Fatalf("INFO memory: %v", err)
	}
	for _, sec := range info {
		if v, ok := sec["used_memory"]; ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("used_memory %q: %v", v, err)
			}
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
}

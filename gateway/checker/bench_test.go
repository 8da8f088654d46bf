package checker

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

const benchTenants = 100_000

func benchNames() []string {
	names := make([]string, benchTenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%06d", i)
	}
	return names
}

// BenchmarkCheck measures checker_check_ns and checker_check_allocs: one
// Checker.Check (tenant × model × API key) with 100,000 tenants loaded, half
// of them with a refusing flag on the model asked for, one goroutine.
func BenchmarkCheck(b *testing.B) {
	c := newTestChecker(b)
	load(c, benchTenants)
	names := benchNames()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		c.Check(names[i%benchTenants], "gpt-4o", "key-1")
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N), "checker_check_ns")
	b.ReportMetric(testing.AllocsPerRun(1000, func() { c.Check(names[7], "gpt-4o", "key-1") }), "checker_check_allocs")
}

// luaSlidingWindow is the per-request check of seed 000's design: trim the
// window, read every entry, sum it, and admit by adding one — a round trip
// to Redis and O(entries) work per request.
var luaSlidingWindow = redis.NewScript(`
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local entries = redis.call('ZRANGE', key, 0, -1)
local used = 0
for i = 1, #entries do
  used = used + tonumber(string.match(entries[i], ':(%d+)$'))
end
if used + cost > limit then
  return {0, used}
end
redis.call('ZADD', key, now, ARGV[5])
redis.call('PEXPIRE', key, window)
return {1, used + cost}
`)

// BenchmarkLuaSlidingWindow measures checker_lua_sliding_window_ns: the seed
// design's Redis Lua sliding window (one EVALSHA per request against the
// real Redis on loopback, 100,000 tenant keys, 60 s window, one goroutine),
// and checker_lua_vs_checker_ratio: that cost divided by Checker.Check's
// measured in the same run under the same 100,000-tenant load.
func BenchmarkLuaSlidingWindow(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the real Redis")
	}
	rdb := redisconn.NewClient(itest.Redis(b))
	defer rdb.Close()
	prefix := itest.Unique(b, "sluice_bench:") + ":"
	cleanup(b, rdb, prefix)
	ctx := context.Background()
	if err := luaSlidingWindow.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	names := benchNames()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		now := time.Now().UnixMilli()
		member := strconv.Itoa(i) + ":" + strconv.Itoa(100+i%50)
		if err := luaSlidingWindow.Run(ctx, rdb, []string{prefix + names[i%benchTenants]}, now, 60_000, 1_000_000, 100+i%50, member).Err(); err != nil {
			b.Fatal(err)
		}
	}
	luaNS := float64(time.Since(start).Nanoseconds()) / float64(b.N)
	b.StopTimer()

	c := newTestChecker(b)
	load(c, benchTenants)
	const checks = 2_000_000
	cs := time.Now()
	for i := range checks {
		c.Check(names[i%benchTenants], "gpt-4o", "key-1")
	}
	checkNS := float64(time.Since(cs).Nanoseconds()) / checks
	b.ReportMetric(luaNS, "checker_lua_sliding_window_ns")
	b.ReportMetric(luaNS/checkNS, "checker_lua_vs_checker_ratio")
}

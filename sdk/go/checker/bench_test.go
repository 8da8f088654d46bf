package checker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

const benchTenants = 100_000

func benchNames() []string {
	names := make([]string, benchTenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%06d", i)
	}
	return names
}

// benchRequest is what a gateway hands Check for one request.
type benchRequest struct{ tenant, model, key string }

// benchModels are the models requests ask for: gpt-4o half the time.
var benchModels = [...]string{"gpt-4o", "gpt-4o", "claude", "gpt-4o-mini"}

// benchRequestCount is a power of two, long enough that the sequence does
// not repeat within the Checker's working set.
const benchRequestCount = 1 << 18

// benchRequests returns requests from tenants picked uniformly at random
// among all benchTenants. The requests' tenant and key strings are cut from
// one buffer written in request order: a real request's tenant and key were
// just parsed and sit in the CPU cache, so the benchmark's own reads must
// not miss the cache where a gateway's would not (here they stream
// sequentially), while the Checker's memory is hit in random order as in
// production. Nothing is derived from the strings ahead of Check.
func benchRequests() []benchRequest {
	r := rand.New(rand.NewPCG(1, 2))
	reqs := make([]benchRequest, benchRequestCount)
	var buf strings.Builder
	type span struct{ tenant, key [2]int }
	spans := make([]span, benchRequestCount)
	models := make([]string, benchRequestCount)
	for i := range spans {
		t0 := buf.Len()
		fmt.Fprintf(&buf, "tenant-%06d", r.IntN(benchTenants))
		k0 := buf.Len()
		fmt.Fprintf(&buf, "key-%d", r.IntN(4))
		spans[i] = span{[2]int{t0, k0}, [2]int{k0, buf.Len()}}
		models[i] = benchModels[r.IntN(len(benchModels))]
	}
	all := buf.String()
	for i, sp := range spans {
		reqs[i] = benchRequest{tenant: all[sp.tenant[0]:sp.tenant[1]], model: models[i], key: all[sp.key[0]:sp.key[1]]}
	}
	return reqs
}

// loadMix installs the flags of a realistic population of n tenants: 80%
// have no flag at all; of every 50 tenants 4 have a quota flag on gpt-4o, 2
// a rate flag on claude, 2 a tenant-wide ("*") flag, 1 a gpt-4o flag plus a
// blacklisted API key, and 1 a half-open breaker on gpt-4o with probes left.
func loadMix(c *Checker, n int) {
	until := time.Now().Add(time.Hour)
	quota := flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "daily_tokens", Period: "day", Until: until, ResetsAt: until})
	rate := flags.Encode(&flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate, Quota: "requests_per_minute", Until: until})
	manual := flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindManual, Until: until})
	banned := flags.Encode(&flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until})
	halfOpen := flags.Encode(&flags.Flag{State: flags.StateHalfOpen, Kind: flags.KindErrorRatio, Probes: 1 << 30, Until: until})
	updates := make(map[string]*tenantView, n/5)
	for i := range n {
		var fields map[string]string
		switch i % 50 {
		case 0, 1, 2, 3:
			fields = map[string]string{"gpt-4o": quota}
		case 4, 5:
			fields = map[string]string{"claude": rate}
		case 6, 7:
			fields = map[string]string{flags.AllModels: manual}
		case 8:
			fields = map[string]string{"gpt-4o": quota, flags.KeyField("key-1"): banned}
		case 9:
			fields = map[string]string{"gpt-4o": halfOpen}
		default:
			continue
		}
		fields[flags.VersionField] = "1"
		name := fmt.Sprintf("tenant-%06d", i)
		updates[name] = c.buildView(name, fields)
	}
	c.apply(updates, 0, false)
}

var (
	benchOnce sync.Once
	benchReqs []benchRequest
)

func sharedRequests() []benchRequest {
	benchOnce.Do(func() { benchReqs = benchRequests() })
	return benchReqs
}

var benchSink Outcome

func runCheckBench(b *testing.B, c *Checker, unit string) float64 {
	reqs := sharedRequests()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var acc Outcome
	for i := 0; i < b.N; i++ {
		r := &reqs[i&(benchRequestCount-1)]
		acc += c.Check(r.tenant, r.model, r.key).Outcome
	}
	elapsed := time.Since(start)
	b.StopTimer()
	benchSink = acc
	ns := float64(elapsed.Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns, unit)
	return ns
}

// mapLookupNs times the reference of checker_check_vs_map_ratio: a plain
// Go map of the flagged tenants' names looked up with the same requests'
// tenants, n lookups — what any in-memory check costs at least.
func mapLookupNs(n int, tenants int) float64 {
	flagged := make(map[string]bool, tenants/5)
	for i := range tenants {
		if i%50 < 10 { // the tenants loadMix flags
			flagged[fmt.Sprintf("tenant-%06d", i)] = true
		}
	}
	reqs := sharedRequests()
	hits := 0
	start := time.Now()
	for i := 0; i < n; i++ {
		if flagged[reqs[i&(benchRequestCount-1)].tenant] {
			hits++
		}
	}
	elapsed := time.Since(start)
	benchSink = Outcome(hits)
	return float64(elapsed.Nanoseconds()) / float64(n)
}

// BenchmarkCheck measures checker_check_ns and checker_check_allocs: one
// Checker.Check (tenant × model × API key, one goroutine) for requests from
// 100,000 tenants picked at random, of which 20% have flags (see loadMix),
// so the Checker holds 20,000 tenants and most requests are for a tenant it
// has nothing on. checker_check_vs_map_ratio divides it by
// checker_map_lookup_ns, a plain Go map of the same flagged tenants looked
// up with the same requests in the same run.
func BenchmarkCheck(b *testing.B) {
	c := newTestChecker(b)
	loadMix(c, benchTenants)
	ns := runCheckBench(b, c, "checker_check_ns")
	// The reference, in the same run on the same machine: a ratio that
	// holds however busy the machine is.
	ref := mapLookupNs(max(b.N, 1_000_000), benchTenants)
	b.ReportMetric(ref, "checker_map_lookup_ns")
	b.ReportMetric(ns/ref, "checker_check_vs_map_ratio")
	r := sharedRequests()[7]
	b.ReportMetric(testing.AllocsPerRun(1000, func() { c.Check(r.tenant, r.model, r.key) }), "checker_check_allocs")
}

// BenchmarkCheckAllFlagged measures checker_check_all_flagged_ns, the worst
// case: every one of the 100,000 tenants has a flag (half on the model most
// requests ask for), requests at random among them.
func BenchmarkCheckAllFlagged(b *testing.B) {
	c := newTestChecker(b)
	load(c, benchTenants)
	runCheckBench(b, c, "checker_check_all_flagged_ns")
}

// BenchmarkTenantHash measures checker_tenant_hash_ns: hashing one tenant
// name, the fixed cost every Check pays before touching the tables.
func BenchmarkTenantHash(b *testing.B) {
	reqs := sharedRequests()
	var acc uint64
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		acc += tenantHash(reqs[i&(benchRequestCount-1)].tenant, 42)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	benchSink = Outcome(acc)
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N), "checker_tenant_hash_ns")
}

// luaSlidingWindow is the per-request check the Checker replaces: trim the
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
	loadMix(c, benchTenants)
	reqs := sharedRequests()
	const checks = 2_000_000
	cs := time.Now()
	for i := range checks {
		r := &reqs[i&(benchRequestCount-1)]
		c.Check(r.tenant, r.model, r.key)
	}
	checkNS := float64(time.Since(cs).Nanoseconds()) / checks
	b.ReportMetric(luaNS, "checker_lua_sliding_window_ns")
	b.ReportMetric(luaNS/checkNS, "checker_lua_vs_checker_ratio")
}

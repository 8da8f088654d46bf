package authz

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/itest/checkertest"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

const benchTenants = 64

// benchEndpoint starts the endpoint on loopback as a deployment runs it:
// 64 tenant keys, the real Checker and the real admission Limiter on the
// shared Redis (prefixes of its own), each tenant with a requests bucket
// and a tokens window. exact makes both rules exact (one Redis round trip
// per check) instead of served from leases.
func benchEndpoint(b *testing.B, exact bool) string {
	b.Helper()
	rc := itest.Redis(b)
	log := slog.New(slog.DiscardHandler)
	rdb := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })

	chk := checkertest.Run(b, rdb, "sluice_bench_authzflags:")

	rules := &admission.Rules{Default: admission.TenantRules{Rules: []admission.Rule{
		{Name: "rpm", Unit: admission.Requests, Algorithm: admission.TokenBucket, Limit: 1_000_000, Rate: 100_000, Exact: exact},
		{Name: "tpm", Unit: admission.TotalTokens, Algorithm: admission.SlidingWindow, Limit: 1 << 40, Window: time.Minute, Exact: exact},
	}}}
	lim, err := admission.New(rdb, rules, admission.WithPrefix(itest.Unique(b, "sluice_bench_authzadm:")+":"), admission.WithMaxWait(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lim.Close() })

	var keys strings.Builder
	keys.WriteString("keys:\n")
	for i := range benchTenants {
		keys.WriteString(frontend.KeyLine(fmt.Sprintf("k%d", i), fmt.Sprintf("sk-bench-%d", i), fmt.Sprintf("t%d", i), nil))
	}
	path := filepath.Join(b.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(keys.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	kf, err := keyfile.Open(path, frontend.ParseKeys, log, nil)
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewServer(DefaultConfig(), Deps{Checker: chk, Admitter: frontend.LimiterAdmitter{L: lim}, Keys: kf, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(s)
	b.Cleanup(hs.Close)
	return hs.URL + "/authz"
}

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}

// benchCheck sends one check as nginx's auth_request does (no body, the
// client's key and model, the original path) and returns its time.
func benchCheck(url string, tenant int) (time.Duration, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-bench-%d", tenant))
	req.Header.Set("X-Sluice-Model", "gpt-4o-mini")
	req.Header.Set("X-Forwarded-Uri", "/v1/chat/completions")
	start := time.Now()
	resp, err := benchClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("check answered %d", resp.StatusCode)
	}
	return took, nil
}

// timeChecks sends one check per iteration of b, one at a time, and
// returns their times.
func timeChecks(b *testing.B, url string) []time.Duration {
	for i := range benchTenants { // warm the connections, the leases and the rule instances
		if _, err := benchCheck(url, i); err != nil {
			b.Fatal(err)
		}
	}
	var took []time.Duration
	i := 0
	b.ResetTimer()
	for b.Loop() {
		d, err := benchCheck(url, i%benchTenants)
		if err != nil {
			b.Fatal(err)
		}
		took = append(took, d)
		i++
	}
	b.StopTimer()
	return took
}

// BenchmarkAuthzCheck measures what one forward-auth check costs a proxy:
// the endpoint on loopback HTTP with keep-alive, key lookup, the real
// Checker and admission on the real Redis (leases, the default), round
// trip included. Latency is one client at a time; throughput is 32
// concurrent clients, the clients in the same process on the same cores.
func BenchmarkAuthzCheck(b *testing.B) {
	if testing.Short() {
		b.Skip("uses the real Redis; skipped with -short")
	}
	url := benchEndpoint(b, false)
	took := timeChecks(b, url)
	b.ReportMetric(itest.Percentile(took, .5).Seconds()*1e6, "authz_check_p50_us")
	b.ReportMetric(itest.Percentile(took, .99).Seconds()*1e6, "authz_check_p99_us")

	const clients = 32
	n := max(b.N, 5000)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1); k <= int64(n) && failed.Load() == nil; k = next.Add(1) {
				if _, err := benchCheck(url, int(k)%benchTenants); err != nil {
					failed.Store(&err)
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "authz_checks_per_sec")
}

// BenchmarkAuthzCheckExact is the same check with both admission rules
// exact: every check makes one Redis round trip (admit.lua), the cost
// when a limit must be decided by Redis each time.
func BenchmarkAuthzCheckExact(b *testing.B) {
	if testing.Short() {
		b.Skip("uses the real Redis; skipped with -short")
	}
	took := timeChecks(b, benchEndpoint(b, true))
	b.ReportMetric(itest.Percentile(took, .5).Seconds()*1e6, "authz_check_exact_p50_us")
	b.ReportMetric(itest.Percentile(took, .99).Seconds()*1e6, "authz_check_exact_p99_us")
}

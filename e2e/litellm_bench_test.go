package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// BenchmarkLiteLLMHook measures what Sluice's hook adds to a call through
// the LiteLLM proxy: two proxies of the same LiteLLM in front of the same
// mock provider, one plain and one with sluice_metering.litellm as its callback
// (flags checked from memory, one admit.lua before the call, the usage
// event and the settlement after it), called one request at a time,
// alternating, so both see the same machine in the same run.
// SLUICE_LITELLM_BENCH_REQUESTS sets the pairs (default 1,000).
func BenchmarkLiteLLMHook(b *testing.B) {
	if testing.Short() {
		b.Skip("starts LiteLLM and ingest; skipped with -short")
	}
	py := litellmPython(b)
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("SLUICE_LITELLM_BENCH_REQUESTS")); err == nil && v > 0 {
		n = v
	}
	s := newStack(b, stackOptions{Policy: policyYAML(nil)})
	s.startAll("ingest")
	up := httptest.NewServer(mockllm.New(mockllm.Options{}))
	b.Cleanup(up.Close)
	rules := `{"default": {"rules": [{"name": "tpm", "unit": "total_tokens", "algorithm": "sliding_window", "limit": 1000000000, "window_ms": 60000}]}}`
	plain := startLiteLLM(b, py, filepath.Join(s.dir, "litellm-plain"), up.URL, litellmRun{})
	hooked := startLiteLLM(b, py, filepath.Join(s.dir, "litellm-hooked"), up.URL, litellmRun{hook: true, env: sluiceHookEnv(b, s, rules)})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	const body = `{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"Say something short."}]}`
	call := func(addr string) time.Duration {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk-ll-bench")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: status %d", addr, resp.StatusCode)
		}
		return time.Since(start)
	}
	// Warm both up: imports, connection pools, the hook's first scripts.
	for range 20 {
		call(plain.addr)
		call(hooked.addr)
	}
	var p, h []time.Duration
	b.ResetTimer()
	for range n {
		p = append(p, call(plain.addr))
		h = append(h, call(hooked.addr))
	}
	b.StopTimer()
	b.ReportMetric(itest.Percentile(p, .5).Seconds()*1e3, "litellm_plain_p50_ms")
	b.ReportMetric(itest.Percentile(h, .5).Seconds()*1e3, "litellm_hooked_p50_ms")
	b.ReportMetric(itest.Percentile(p, .99).Seconds()*1e3, "litellm_plain_p99_ms")
	b.ReportMetric(itest.Percentile(h, .99).Seconds()*1e3, "litellm_hooked_p99_ms")
	b.ReportMetric((itest.Percentile(h, .5)-itest.Percentile(p, .5)).Seconds()*1e3, "litellm_added_p50_ms")
	b.ReportMetric((itest.Percentile(h, .99)-itest.Percentile(p, .99)).Seconds()*1e3, "litellm_added_p99_ms")
}

// gvlLatencies are the two providers of BenchmarkGatewayVsLiteLLM: the
// mock answers gpt-4o-mini at once and holds every gpt-4o call 200 ms
// (mockllm.Options.Latency, with a capacity no run reaches).
var gvlLatencies = []struct{ name, model string }{{"instant", "gpt-4o-mini"}, {"200ms", "gpt-4o"}}

// gvlLimits are the per-key limits of the limited mode, the same policy
// rules for both sides: one request and the call's tokens debited from
// two one-minute windows of key ll-bench-key (`sluice gateway`'s key id,
// and the key alias the hook reads from LiteLLM), exact so that each call
// runs one admit.lua on both sides (the Python hook takes no leases), and
// high enough that they decide every call but never refuse one.
const gvlLimits = `  ll-bench:
    limits:
      per-key-rpm:
        scope: {key: "*"}
        unit: requests
        sliding_window: {length: 1m, limit: 1000000000}
        exact: true
      per-key-tpm:
        scope: {key: "*"}
        unit: total_tokens
        sliding_window: {length: 1m, limit: 1000000000}
        exact: true
`

// gvlProxy is one proxy under test: its address and the process whose
// CPU time (its descendants' included) it is charged.
type gvlProxy struct {
	addr string
	pid  int
}

// gvlPoint is what one run at one concurrency measured.
type gvlPoint struct {
	n        int
	rps      float64
	p50, p99 time.Duration
	cpu      time.Duration // the proxy's, over the run; 0 for the direct run
}

// BenchmarkGatewayVsLiteLLM puts `sluice gateway` and the LiteLLM proxy
// side by side in one run, each as its own process(es) in front of the
// same mock provider (in this process), driven by the same closed-loop
// clients with the same body, both metering into the real ingest (and
// Kafka) of the stack:
//
//   - LiteLLM as its production guide recommends for throughput
//     (litellmRun.production: a worker per core), metering with Sluice's
//     hook (its own spend tracking needs Postgres);
//   - `sluice gateway` with its defaults but the hook's 50 ms admission
//     wait, usage events to ingest;
//   - two modes: metered (no limit), and limited (gvlLimits on both, the
//     hook's admission against the gateway's);
//   - two providers (gvlLatencies) and a sweep of concurrent clients,
//     SLUICE_GVL_CLIENTS (default 1,8,32,64), each point SLUICE_GVL_REQUESTS
//     requests (default 600) — with the 200 ms provider at most
//     SLUICE_GVL_SLOW_ROUNDS (20) per client, so that one client does not
//     take minutes.
//
// At each point the direct run (straight to the mock) is the baseline of
// added latency; each proxy's CPU is read from /proc (utime + stime of it
// and its descendants: LiteLLM's worker processes). bench/README.md
// describes the keys and the configuration of each side.
func BenchmarkGatewayVsLiteLLM(b *testing.B) {
	if testing.Short() {
		b.Skip("starts LiteLLM, `sluice gateway` and ingest; skipped with -short")
	}
	py := litellmPython(b)
	sweep := envInts(b, "SLUICE_GVL_CLIENTS", "1,8,32,64", 1, 256)
	n := envInt(b, "SLUICE_GVL_REQUESTS", 600, 10, 1_000_000)
	rounds := envInt(b, "SLUICE_GVL_SLOW_ROUNDS", 20, 1, 10_000)
	up := httptest.NewServer(mockllm.New(mockllm.Options{Capacity: 1 << 30, Latency: 200 * time.Millisecond, CapacityModels: []string{"gpt-4o"}}))
	b.Cleanup(up.Close)
	s := newStack(b, stackOptions{Policy: policyYAML(nil)})
	s.startAll("ingest")
	writeFileT(b, filepath.Join(s.dir, "gateway-keys.yaml"), "keys:\n"+frontend.KeyLine("ll-bench-key", gvlKey, "ll-bench", nil))
	modes := []string{"metered", "limited"}
	gw, ll := map[string]gvlProxy{}, map[string]gvlProxy{}
	for _, mode := range modes {
		gw[mode], ll[mode] = gvlStart(b, s, py, up.URL, mode)
	}
	gvlCheckAdmission(b, s, gw["limited"], ll["limited"])

	load0, m0 := loadavg(), machineCPU(b)
	start := time.Now()
	b.ResetTimer()
	for _, lat := range gvlLatencies {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"Summarise the incident: the nightly batch job exhausted the tenant's tokens-per-minute quota."}]}`, lat.model)
		for _, c := range sweep {
			pn := n
			if lat.name != "instant" {
				pn = min(n, c*rounds)
			}
			direct := gvlMeasure(b, gvlProxy{addr: strings.TrimPrefix(up.URL, "http://")}, body, c, pn)
			fmt.Printf("gateway vs LiteLLM, %s provider, %d clients, %d requests: direct p50 %.2f ms p99 %.2f ms\n",
				lat.name, c, pn, ms(direct.p50), ms(direct.p99))
			for _, mode := range modes {
				g := gvlMeasure(b, gw[mode], body, c, pn)
				l := gvlMeasure(b, ll[mode], body, c, pn)
				gvlReport(b, fmt.Sprintf("%s_%s_c%d", mode, lat.name, c), direct, g, l)
			}
		}
	}
	b.StopTimer()
	wall := time.Since(start)
	other, steal := machineCPU(b).cores(m0, 0, wall)
	fmt.Printf("gateway vs LiteLLM: %s in all; machine %.2f cores busy (both proxies, the clients, the mock, ingest, Kafka and anything else), %.2f stolen; load average %s at the start, %s at the end\n",
		wall.Round(time.Second), other, steal, load0, loadavg())
}

// gvlKey is the client's key on both sides: testdata/litellm/custom_auth.py's
// key of team ll-bench (alias ll-bench-key), and the gateway's key
// ll-bench-key of tenant ll-bench.
const gvlKey = "sk-ll-bench"

// gvlStart writes mode's policy (the stack's, plus the mock as upstream
// and, limited, gvlLimits) and starts `sluice gateway` and LiteLLM on it.
func gvlStart(b *testing.B, s *stack, py, upstream, mode string) (gw, ll gvlProxy) {
	b.Helper()
	pol := policyYAML(nil)
	if mode == "limited" {
		pol += gvlLimits
	}
	pol += fmt.Sprintf("upstreams:\n  mock: {base_url: \"%s/v1\", models: [\"gpt-4o\", \"gpt-4o-mini\"]}\n", upstream)
	path := filepath.Join(s.dir, mode+"-policy.yaml")
	writeFileT(b, path, pol)
	// The hook reads its rules from the same file (exec keeps the last
	// SLUICE_POLICY_FILE of the environment).
	env := append(sluiceHookEnv(b, s, ""), "SLUICE_POLICY_FILE="+path, "SLUICE_GATEWAY_NAME="+s.prefix+"litellm-"+mode)
	p := startLiteLLM(b, py, filepath.Join(s.dir, "litellm-"+mode), upstream, litellmRun{hook: true, env: env, production: true})
	ll = gvlProxy{addr: p.addr, pid: p.cmd.Process.Pid}

	gw.addr = freeAddr(b)
	g := s.spawnAs("gateway-"+mode, "gateway", "-policy.file="+path, "-services.gateway.listen="+gw.addr,
		"-services.gateway.name="+s.prefix+"gateway-"+mode,
		"-services.gateway.usage.ingest_url=http://"+s.ingestAddr,
		"-services.gateway.usage.ingest_api_key_file="+filepath.Join(s.dir, "ingest-key"),
		// The hook's default (SLUICE_ADMISSION_MAX_WAIT 50 ms), so that both
		// wait as long for Redis before a tenant's fail mode decides.
		"-services.gateway.admission.max_wait=50ms")
	s.waitReady(g)
	gw.pid = g.cmd.Process.Pid
	return gw, ll
}

// gvlCheckAdmission makes sure both limited proxies run the rules: a call
// through each leaves the per-key windows' keys in Redis — the tokens
// window's at least, which the settlement writes even when Redis answered
// the admission too late and the tenant's fail-open local limiter decided
// it.
func gvlCheckAdmission(b *testing.B, s *stack, gw, ll gvlProxy) {
	b.Helper()
	ctx := context.Background()
	pattern := s.redisPrefix + redisconn.AdmissionKeys + "{t:ll-bench:per-key-*"
	body := `{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"Say something short."}]}`
	for _, p := range []gvlProxy{gw, ll} {
		if held, err := s.rdb.Keys(ctx, pattern).Result(); err != nil || (len(held) > 0 && s.rdb.Del(ctx, held...).Err() != nil) {
			b.Fatal(err)
		}
		if _, err := gvlCall(p.addr, body); err != nil {
			b.Fatal(err)
		}
		itest.EventuallyNoError(b, waitTimeout, "the per-key rules' windows in Redis after a call through "+p.addr, func() error {
			held, err := s.rdb.Keys(ctx, pattern).Result()
			if err != nil || len(held) == 0 {
				return fmt.Errorf("no key %s (%v)", pattern, err)
			}
			return nil
		})
	}
}

var gvlClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 60 * time.Second}

// gvlCall sends one chat completion and reads the whole answer.
func gvlCall(addr, body string) (time.Duration, error) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+gvlKey)
	resp, err := gvlClient.Do(req)
	if err != nil {
		return 0, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: status %d: %.300s", addr, resp.StatusCode, answer)
	}
	return time.Since(start), nil
}

// gvlMeasure runs n calls from the given number of closed-loop clients
// (after a warm-up of two calls each, not counted) and reads the proxy's
// CPU over the run.
func gvlMeasure(b *testing.B, p gvlProxy, body string, clients, n int) gvlPoint {
	b.Helper()
	run := func(n int) ([]time.Duration, time.Duration) {
		lat := make([]time.Duration, n)
		var next atomic.Int64
		var firstErr atomic.Pointer[error]
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(n) && firstErr.Load() == nil; i = next.Add(1) - 1 {
					d, err := gvlCall(p.addr, body)
					if err != nil {
						firstErr.CompareAndSwap(nil, &err)
						return
					}
					lat[i] = d
				}
			})
		}
		wg.Wait()
		if err := firstErr.Load(); err != nil {
			b.Fatal(*err)
		}
		return lat, time.Since(start)
	}
	run(2 * clients)
	cpu0 := gvlCPU(b, p.pid)
	lat, wall := run(n)
	return gvlPoint{n: n, rps: float64(n) / wall.Seconds(), p50: itest.Percentile(lat, .5), p99: itest.Percentile(lat, .99),
		cpu: gvlCPU(b, p.pid) - cpu0}
}

// gvlCPU is the CPU time of pid and its descendants (0 for pid 0).
func gvlCPU(b *testing.B, pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	cpu, err := procTreeCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}

// Floors of the ratios' denominators, below which a figure is within the
// run's resolution: /proc counts CPU in 10 ms ticks, a median added under
// 50 µs is noise between two runs, and so is a 99th percentile added
// under 1 ms on a shared machine (it came out negative: the direct run's
// own tail was longer).
const (
	gvlCPUFloor      = 10 * time.Millisecond
	gvlAddedP50Floor = 50 * time.Microsecond
	gvlAddedP99Floor = time.Millisecond
)

// gvlReport publishes one point: each side's raw figures, and the ratios,
// each oriented so that above 1 means `sluice gateway` does better.
func gvlReport(b *testing.B, point string, direct, gw, ll gvlPoint) {
	added := func(p gvlPoint) (time.Duration, time.Duration) { return p.p50 - direct.p50, p.p99 - direct.p99 }
	for side, p := range map[string]gvlPoint{"gateway": gw, "litellm": ll} {
		a50, a99 := added(p)
		pre := "gateway_vs_litellm_" + side + "_" + point + "_"
		b.ReportMetric(p.rps, pre+"rps")
		b.ReportMetric(float64(p.cpu.Microseconds())/float64(p.n), pre+"cpu_us_per_request")
		b.ReportMetric(ms(a50), pre+"added_p50_ms")
		b.ReportMetric(ms(a99), pre+"added_p99_ms")
	}
	perReq := func(p gvlPoint) float64 { return max(p.cpu, gvlCPUFloor).Seconds() / float64(p.n) }
	g50, g99 := added(gw)
	l50, l99 := added(ll)
	pre := "gateway_vs_litellm_" + point + "_"
	b.ReportMetric(gw.rps/ll.rps, pre+"rps_ratio")
	b.ReportMetric(perReq(ll)/perReq(gw), pre+"rps_per_core_ratio")
	b.ReportMetric(max(l50, gvlAddedP50Floor).Seconds()/max(g50, gvlAddedP50Floor).Seconds(), pre+"added_p50_ratio")
	b.ReportMetric(max(l99, gvlAddedP99Floor).Seconds()/max(g99, gvlAddedP99Floor).Seconds(), pre+"added_p99_ratio")
	fmt.Printf("  %-20s gateway %8.0f/s %7.0f µs CPU/req +%.2f/+%.2f ms | LiteLLM %6.0f/s %7.0f µs CPU/req +%.2f/+%.2f ms\n", point,
		gw.rps, perReq(gw)*1e6, ms(g50), ms(g99), ll.rps, perReq(ll)*1e6, ms(l50), ms(l99))
}

package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
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
	plain := startLiteLLM(b, py, filepath.Join(s.dir, "litellm-plain"), up.URL, false, nil)
	hooked := startLiteLLM(b, py, filepath.Join(s.dir, "litellm-hooked"), up.URL, true, sluiceHookEnv(b, s, rules))

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

package gateway

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/itest/checkertest"
	"github.com/sluicehq/sluice/platform/tracing"
	"github.com/sluicehq/sluice/platform/tracing/tracingtest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/emitter"
)

const (
	benchChat   = `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"Summarise the incident: the nightly batch job exhausted the tenant's tokens-per-minute quota."}]}`
	benchStream = `{"model":"gpt-4o-mini","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Stream a short answer."}]}`
)

// discard is an emitter Sender that acknowledges every batch: the
// benchmarks measure the gateway with its Emitter working, not ingest.
type discard struct{ events atomic.Int64 }

func (d *discard) Send(_ context.Context, evs []schemas.UsageEvent) ([]emitter.Rejection, error) {
	d.events.Add(int64(len(evs)))
	return nil, nil
}

// benchGateway starts the mock provider and the gateway in front of it,
// with a real Checker (the shared Redis, a key prefix of its own) and a
// real Emitter (into discard), tracing with tp (nil: off).
func benchGateway(b *testing.B, tp trace.TracerProvider) (direct, proxied string, em *emitter.Emitter, sent *discard) {
	b.Helper()
	up := httptest.NewServer(mockllm.New(mockllm.Options{StreamUsage: mockllm.UsageWhenAsked}))
	b.Cleanup(up.Close)
	cfg := testConfig(b, Upstream{Name: "mock", BaseURL: up.URL + "/v1", Models: []string{"*"}})
	log := slog.New(slog.DiscardHandler)

	rc := itest.Redis(b)
	rdb := redis.NewClient(&redis.Options{Addr: rc.Addr})
	b.Cleanup(func() { rdb.Close() })
	chk := checkertest.Run(b, rdb, "gwbench")

	sent = &discard{}
	ecfg := emitter.DefaultConfig()
	ecfg.Logger = log
	var err error
	em, err = emitter.New(sent, ecfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = em.Close(context.Background()) })
	p := cfg.parsePolicy(b)
	guards := NewGuards(nil, "", "bench", log, nil)
	b.Cleanup(guards.Close)
	if err := guards.Update(p); err != nil {
		b.Fatal(err)
	}
	keys, err := frontend.OpenKeys(writeKeys(b), log, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(cfg.Config, Deps{Checker: chk, Emitter: em, Logger: log, Keys: keys, Policy: func() *policy.Policy { return p }, Guards: guards, Tracing: tp})
	if err != nil {
		b.Fatal(err)
	}
	gw := httptest.NewServer(srv)
	b.Cleanup(gw.Close)
	return up.URL, gw.URL, em, sent
}

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}

// benchCall sends one request to base and returns the time to the first body
// byte and to the end of the answer.
func benchCall(b *testing.B, base, body, key string) (ttfb, total time.Duration) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := benchClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err != nil {
		b.Fatalf("%s: empty answer (%d)", base, resp.StatusCode)
	}
	ttfb = time.Since(start)
	_, _ = io.Copy(io.Discard, br)
	if resp.StatusCode != 200 {
		b.Fatalf("%s: status %d", base, resp.StatusCode)
	}
	return ttfb, time.Since(start)
}

// BenchmarkGatewayOverhead measures what the gateway adds to a call, one
// client at a time, against calling the mock provider directly in the
// same run (each iteration calls both, alternating, so both see the same
// machine): plain chat completions end to end, and the time to the first
// byte of a stream. Flags checked, estimate and settlement emitted.
func BenchmarkGatewayOverhead(b *testing.B) {
	if testing.Short() {
		b.Skip("uses the real Redis; skipped with -short")
	}
	direct, proxied, _, _ := benchGateway(b, nil)
	var dPlain, pPlain, dTTFB, pTTFB []time.Duration
	b.ResetTimer()
	for b.Loop() {
		_, d := benchCall(b, direct, benchChat, "")
		_, p := benchCall(b, proxied, benchChat, "sk-acme")
		dt, _ := benchCall(b, direct, benchStream, "")
		pt, _ := benchCall(b, proxied, benchStream, "sk-acme")
		dPlain, pPlain, dTTFB, pTTFB = append(dPlain, d), append(pPlain, p), append(dTTFB, dt), append(pTTFB, pt)
	}
	b.StopTimer()
	b.ReportMetric(itest.Percentile(dPlain, .5).Seconds()*1e3, "gateway_direct_p50_ms")
	b.ReportMetric(itest.Percentile(pPlain, .5).Seconds()*1e3, "gateway_proxied_p50_ms")
	b.ReportMetric((itest.Percentile(pPlain, .5)-itest.Percentile(dPlain, .5)).Seconds()*1e3, "gateway_added_p50_ms")
	b.ReportMetric((itest.Percentile(pPlain, .99)-itest.Percentile(dPlain, .99)).Seconds()*1e3, "gateway_added_p99_ms")
	b.ReportMetric(itest.Percentile(dTTFB, .5).Seconds()*1e3, "gateway_stream_ttfb_direct_p50_ms")
	b.ReportMetric(itest.Percentile(pTTFB, .5).Seconds()*1e3, "gateway_stream_ttfb_proxied_p50_ms")
	b.ReportMetric((itest.Percentile(pTTFB, .5)-itest.Percentile(dTTFB, .5)).Seconds()*1e3, "gateway_stream_ttfb_added_p50_ms")
	b.ReportMetric((itest.Percentile(pTTFB, .99)-itest.Percentile(dTTFB, .99)).Seconds()*1e3, "gateway_stream_ttfb_added_p99_ms")
}

// BenchmarkGatewayTracing measures what tracing adds to a call through
// the gateway: two gateways in one run, one with tracing off (the
// default) and one recording every call (sample_ratio 1, a server span
// and its admission and dispatch children) and exporting to an
// in-process OTLP receiver, called alternately one client at a time with
// plain chat completions; and the CPU each adds per 1,000 calls from 32
// concurrent clients.
func BenchmarkGatewayTracing(b *testing.B) {
	if testing.Short() {
		b.Skip("uses the real Redis; skipped with -short")
	}
	rcv := tracingtest.NewReceiver(b)
	tc := tracing.Defaults()
	tc.Enabled, tc.Endpoint, tc.Interval = true, rcv.URL, 100*time.Millisecond
	tp, err := tracing.New(tc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, off, _, _ := benchGateway(b, nil)
	_, on, _, _ := benchGateway(b, tp)
	var tOff, tOn []time.Duration
	b.ResetTimer()
	for b.Loop() {
		_, d := benchCall(b, off, benchChat, "sk-acme")
		_, p := benchCall(b, on, benchChat, "sk-acme")
		tOff, tOn = append(tOff, d), append(tOn, p)
	}
	cpu := func(base string) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		cpu0 := cpuTime()
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= 2000 {
					benchCall(b, base, benchChat, "sk-acme")
				}
			}()
		}
		wg.Wait()
		return cpuTime() - cpu0
	}
	cpuOff, cpuOn := cpu(off), cpu(on)
	b.StopTimer()
	b.ReportMetric(itest.Percentile(tOff, .5).Seconds()*1e3, "gateway_tracing_off_p50_ms")
	b.ReportMetric(itest.Percentile(tOn, .5).Seconds()*1e3, "gateway_tracing_on_p50_ms")
	b.ReportMetric((itest.Percentile(tOn, .5)-itest.Percentile(tOff, .5)).Seconds()*1e6, "gateway_tracing_added_p50_us")
	b.ReportMetric((itest.Percentile(tOn, .99)-itest.Percentile(tOff, .99)).Seconds()*1e6, "gateway_tracing_added_p99_us")
	b.ReportMetric(float64((cpuOn-cpuOff).Microseconds())/2000, "gateway_tracing_cpu_ms_per_1k_requests")
	if len(rcv.Spans()) == 0 {
		b.Fatal("the traced gateway exported no span")
	}
}

// BenchmarkGatewayThroughput drives the gateway with 32 concurrent
// clients (plain chat completions, the Checker and the Emitter on) and
// reports the requests per second it sustains and the CPU it adds per
// 1,000 requests: the process's CPU time through the gateway minus the
// same number of requests sent straight to the mock (client and mock run
// in this process in both runs, so the difference is the gateway's).
func BenchmarkGatewayThroughput(b *testing.B) {
	if testing.Short() {
		b.Skip("uses the real Redis; skipped with -short")
	}
	direct, proxied, em, sent := benchGateway(b, nil)
	const clients = 32
	run := func(base, key string, n int) (time.Duration, time.Duration) {
		var next atomic.Int64
		var wg sync.WaitGroup
		cpu0 := cpuTime()
		start := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					benchCall(b, base, benchChat, key)
				}
			}()
		}
		wg.Wait()
		return time.Since(start), cpuTime() - cpu0
	}
	n := max(b.N, 200)
	b.ResetTimer()
	_, directCPU := run(direct, "", n)
	wall, proxiedCPU := run(proxied, "sk-acme", n)
	b.StopTimer()
	b.ReportMetric(float64(n)/wall.Seconds(), "gateway_requests_per_sec")
	b.ReportMetric(float64((proxiedCPU-directCPU).Microseconds())/1000/float64(n)*1000, "gateway_cpu_ms_per_1k_requests")
	if err := em.Flush(context.Background()); err != nil || sent.events.Load() < int64(n) {
		b.Fatalf("the Emitter delivered %d events for %d requests: %v", sent.events.Load(), n, err)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

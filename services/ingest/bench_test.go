package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/ingest/payload"
)

// benchEvent is a typical gateway event: required fields plus the optional
// ones a gateway usually fills and two attributes.
const benchEvent = `{"id":"%s","time":"%s","tenant":"acme-corp","model":"gpt-4o-2024-08-06","prompt_tokens":1234,"completion_tokens":567,"cached_tokens":200,"user":"user-42","provider":"openai","endpoint":"/v1/chat/completions","status":200,"outcome":"ok","latency_ms":2345,"priority":"normal","gateway":"gw-eu-1","attributes":{"team":"search","feature":"summaries"}}`

// BenchmarkDecodeValidate measures the ingest request path's decode and
// validate per event (framing, schemas decoder, validation, time window and
// tenant scope) on a 1,000-event JSON array, one goroutine, no I/O.
// Reports ingest_decode_validate_ns (ns per event) and
// ingest_decode_validate_allocs (allocations per event), and
// ingest_decode_vs_encoding_json_ratio: that time over
// ingest_encoding_json_decode_ns, encoding/json decoding the same body
// into the same events (no validation) in the same run.
func BenchmarkDecodeValidate(b *testing.B) {
	now := time.Now().UTC()
	evs := make([]string, 1000)
	for i := range evs {
		evs[i] = fmt.Sprintf(benchEvent, fmt.Sprintf("01J9ZQ3K7M8N-%06d", i), now.Format(time.RFC3339Nano))
	}
	body := []byte("[" + strings.Join(evs, ",") + "]")
	lim := payload.Limits{MaxEvents: 5000, MaxPast: 72 * time.Hour, MaxFuture: 5 * time.Minute}
	allow := func(string) bool { return true }
	var batch payload.Batch
	if err := payload.Decode(payload.JSON, body, lim, now, allow, &batch); err != nil || len(batch.Events) != 1000 {
		b.Fatalf("decode: %v, %d events, rejected %+v", err, len(batch.Events), batch.Rejected)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	for b.Loop() {
		_ = payload.Decode(payload.JSON, body, lim, now, allow, &batch)
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	events := float64(b.N) * 1000
	ns := float64(b.Elapsed().Nanoseconds()) / events
	b.ReportMetric(ns, "ingest_decode_validate_ns")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/events, "ingest_decode_validate_allocs")
	// The reference, in the same run on the same body: encoding/json
	// decoding it into the same event type, without validation.
	var ref []schemas.UsageEvent
	rounds := max(b.N, 20)
	start := time.Now()
	for range rounds {
		ref = ref[:0]
		if err := json.Unmarshal(body, &ref); err != nil || len(ref) != 1000 {
			b.Fatalf("encoding/json: %v, %d events", err, len(ref))
		}
	}
	refNs := float64(time.Since(start).Nanoseconds()) / float64(rounds) / 1000
	b.ReportMetric(refNs, "ingest_encoding_json_decode_ns")
	b.ReportMetric(ns/refNs, "ingest_decode_vs_encoding_json_ratio")
}

// BenchmarkIngest1 posts 1-event requests from 64 concurrent clients over
// loopback HTTP to ingest producing to the real broker (acks=all), and
// reports events/s and p50/p99 request latency (ms) under that load.
func BenchmarkIngest1(b *testing.B) { benchIngest(b, 1, 64) }

// BenchmarkIngest100 posts 100-event requests from 16 concurrent clients
// to ingest producing to the real broker; events/s and p50/p99 ms.
func BenchmarkIngest100(b *testing.B) { benchIngest(b, 100, 16) }

// BenchmarkIngest1000 posts 1,000-event requests from 8 concurrent clients
// to ingest producing to the real broker; events/s and p50/p99 ms.
func BenchmarkIngest1000(b *testing.B) { benchIngest(b, 1000, 8) }

func benchIngest(b *testing.B, batch, clients int) {
	if testing.Short() {
		b.Skip("needs the real broker; skipped with -short")
	}
	compression := "lz4"
	if c := os.Getenv("SLUICE_BENCH_COMPRESSION"); c != "" {
		compression = c // to compare codecs: SLUICE_BENCH_COMPRESSION=zstd
	}
	// To compare producer lingers: SLUICE_BENCH_LINGER=1ms (default: the
	// service's).
	linger := time.Duration(-1)
	if v := os.Getenv("SLUICE_BENCH_LINGER"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("SLUICE_BENCH_LINGER=%q: %v", v, err)
		}
		linger = d
	}
	// To see one request's latency without queueing behind others:
	// SLUICE_BENCH_CLIENTS=1 (RunParallel runs at least GOMAXPROCS clients).
	if v := os.Getenv("SLUICE_BENCH_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("SLUICE_BENCH_CLIENTS=%q: want a positive count", v)
		}
		clients = n
	}
	// To send every request through the one lingering producer:
	// SLUICE_BENCH_SMALL_MAX_EVENTS=0 (services.ingest.small_request_max_events;
	// default: the service's, 16).
	smallMax := -1
	if v := os.Getenv("SLUICE_BENCH_SMALL_MAX_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("SLUICE_BENCH_SMALL_MAX_EVENTS=%q: want a count, 0 or more", v)
		}
		smallMax = n
	}
	inst := startIngest(b, func(c *Config) {
		c.Compression = compression
		c.DedupMaxIDs = 2_000_000
		if linger >= 0 {
			c.Linger = linger
		}
		if smallMax >= 0 {
			c.SmallRequestMaxEvents = smallMax
		}
	})
	tmpl := newBodyTemplate(batch)
	tr := &http.Transport{MaxIdleConnsPerHost: clients * 2, MaxConnsPerHost: clients * 2}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 60 * time.Second}

	var (
		seq       atomic.Int64
		mu        sync.Mutex
		latencies []time.Duration
		failures  atomic.Int64
	)
	send := func(buf []byte, lat *[]time.Duration) {
		n := seq.Add(1)
		body := tmpl.fill(buf, n)
		req, _ := http.NewRequest(http.MethodPost, inst.url+"/v1/events", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := cl.Do(req)
		if err != nil {
			failures.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		*lat = append(*lat, time.Since(start))
		if resp.StatusCode != http.StatusAccepted {
			failures.Add(1)
		}
	}
	// Warm the connection pool and the producer's metadata.
	warm := make([]byte, len(tmpl.body))
	var discard []time.Duration
	for range clients {
		send(warm, &discard)
	}
	failures.Store(0)

	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, len(tmpl.body))
		var lat []time.Duration
		for pb.Next() {
			send(buf, &lat)
		}
		mu.Lock()
		latencies = append(latencies, lat...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	if f := failures.Load(); f > 0 {
		b.Fatalf("%d of %d requests failed", f, b.N)
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[min(len(latencies)-1, int(p*float64(len(latencies))))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), fmt.Sprintf("ingest_events_per_sec_batch%d", batch))
	b.ReportMetric(pct(0.50), fmt.Sprintf("ingest_request_p50_ms_batch%d", batch))
	b.ReportMetric(pct(0.99), fmt.Sprintf("ingest_request_p99_ms_batch%d", batch))
	// CPU per event moves much less than the rate with what else the
	// machine runs; it includes the clients, which share this process.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*batch), fmt.Sprintf("ingest_process_cpu_us_per_event_batch%d", batch))
}

// processCPU is the user and system CPU time this process used so far,
// every thread.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// bodyTemplate is a request body whose event ids carry a fixed-width
// request number, so that every request is new to the dedup window while
// building it costs a copy and a few digit writes.
type bodyTemplate struct {
	body    []byte
	offsets []int // where each id's 12-digit request number starts
}

func newBodyTemplate(n int) *bodyTemplate {
	t := &bodyTemplate{}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	run := fmt.Sprintf("%08x", time.Now().UnixNano()&0xffffffff)
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i := range n {
		if i > 0 {
			buf.WriteByte(',')
		}
		prefix := fmt.Sprintf(`{"id":"%s-`, run)
		t.offsets = append(t.offsets, buf.Len()+len(prefix))
		fmt.Fprintf(&buf, benchEvent, fmt.Sprintf("%s-000000000000-%04d", run, i), now)
	}
	buf.WriteByte(']')
	t.body = buf.Bytes()
	return t
}

func (t *bodyTemplate) fill(dst []byte, n int64) []byte {
	copy(dst, t.body)
	for _, off := range t.offsets {
		v := n
		for i := off + 11; i >= off; i-- {
			dst[i] = byte('0' + v%10)
			v /= 10
		}
	}
	return dst[:len(t.body)]
}

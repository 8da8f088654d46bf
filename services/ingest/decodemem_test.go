package ingest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// metric reads an unlabelled gauge or counter of the instance's registry.
func (i *testInstance) metric(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := i.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			if g := mf.Metric[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return mf.Metric[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestDecodeMemoryBudget: while one authenticated gzip body holds its
// share of decode_memory_bytes (it expanded to max_body_bytes and has not
// ended), a request that needs more than is left gets 503 with Retry-After
// naming the setting instead of more memory; once the first ends, the
// budget is free again and the second goes through. 50 parallel 1
// GiB-of-zeros bombs used to grow the process to 645 MB.
func TestDecodeMemoryBudget(t *testing.T) {
	const maxBody = 1 << 20
	inst := startIngest(t, func(c *Config) {
		c.MaxBodyBytes = maxBody
		c.DecodeMemoryBytes = decodeCostFactor*maxBody + decodeOverhead
	})

	// The bomb: max_body_bytes of zeros, gzip-flushed so the server can
	// decode them all, then nothing until the test closes the pipe.
	pr, pw := io.Pipe()
	bomb := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, inst.url+"/v1/events", pr)
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			bomb <- 0
			return
		}
		resp.Body.Close()
		bomb <- resp.StatusCode
	}()
	zw := gzip.NewWriter(pw)
	if _, err := zw.Write(make([]byte, maxBody)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Flush(); err != nil {
		t.Fatal(err)
	}
	// Its inflater and the arrays it was read into: all but 16 KiB of
	// twice max_body_bytes.
	itest.Eventually(t, 30*time.Second, "the bomb to hold its share of the decode budget", func() bool {
		return inst.metric(t, "sluice_ingest_decode_memory_bytes") >= 2*maxBody
	})

	// 4,000 events, about 600 KiB: more than the budget has left.
	var evs []string
	for i := range 4000 {
		evs = append(evs, eventJSON(fmt.Sprintf("dm-%d", i), "acme"))
	}
	body := []byte(batchJSON(evs...))
	a := post(t, inst.url, testKey, "application/json", body)
	if a.code != http.StatusServiceUnavailable || a.retryAfter == "" || !strings.Contains(a.body.Error, "decode_memory_bytes") {
		t.Fatalf("request while the budget is held: %d %.300s (Retry-After %q), want 503 naming decode_memory_bytes", a.code, a.raw, a.retryAfter)
	}

	_ = zw.Close()
	_ = pw.Close()
	if code := <-bomb; code != http.StatusBadRequest {
		t.Errorf("the bomb (zeros, not JSON) got %d, want 400", code)
	}
	itest.Eventually(t, 30*time.Second, "the decode budget to be returned", func() bool {
		return inst.metric(t, "sluice_ingest_decode_memory_bytes") == 0
	})
	if a := post(t, inst.url, testKey, "application/json", body); a.code != http.StatusAccepted {
		t.Fatalf("request after the budget was returned: %d %.300s, want 202", a.code, a.raw)
	}
}

// gzipped returns n zero bytes gzip-compressed and flushed, the stream
// left open (no trailer): a bomb the server decodes and then waits on.
func gzipped(t testing.TB, n int) []byte {
	t.Helper()
	var z bytes.Buffer
	zw, err := gzip.NewWriterLevel(&z, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Flush(); err != nil {
		t.Fatal(err)
	}
	return z.Bytes()
}

// heapAllocs is the bytes the process has allocated on the heap so far.
func heapAllocs() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// TestGzipBombIsChargedWhatItAllocates: decode_memory_bytes must bound
// what a request really allocates, not a multiple of its body that
// misses the rest. A gzip bomb that expanded to max_body_bytes (8 MiB) and
// waits for more holds its inflater and the arrays its body was read into;
// the charge against the budget must cover every byte the process
// allocated meanwhile (the test's own client allocates a few kilobytes).
// Charging three times the decoded bytes missed the buffer's growth to
// twice the limit for the one byte past it: 32 MiB allocated, 24 charged.
func TestGzipBombIsChargedWhatItAllocates(t *testing.T) {
	inst := startIngest(t, nil)
	const maxBody = 8 << 20
	bombBytes := gzipped(t, maxBody)
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	req, err := http.NewRequest(http.MethodPost, inst.url+"/v1/events", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	runtime.GC()
	before := heapAllocs()
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	if _, err := pw.Write(bombBytes); err != nil {
		t.Fatal(err)
	}
	// The server read all of it and waits: the charge stops moving.
	var charged float64
	itest.Eventually(t, 30*time.Second, "the bomb's charge to settle past max_body_bytes", func() bool {
		c := inst.metric(t, "sluice_ingest_decode_memory_bytes")
		settled := c >= maxBody && c == charged
		charged = c
		return settled
	})
	allocated := float64(heapAllocs() - before)
	_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	<-done
	t.Logf("the bomb allocated %.1f MiB, charged %.1f MiB", allocated/(1<<20), charged/(1<<20))
	if allocated > charged+(1<<20) {
		t.Fatalf("a gzip bomb allocated %.1f MiB but was charged %.1f MiB against decode_memory_bytes", allocated/(1<<20), charged/(1<<20))
	}
}

// TestConcurrentGzipBombsStayNearTheBudget: 50 clients sending 64 MiB of
// zeros gzipped (64 KiB on the wire), four times each, against a 32 MiB
// budget. Every bomb is answered 413 (too large once decoded) or 503 with
// Retry-After (the budget is full), the budget is returned, and the heap
// grows by at most twice the budget: the documented figure, the live
// charge plus what the collector has not freed yet (GOGC=100).
func TestConcurrentGzipBombsStayNearTheBudget(t *testing.T) {
	const budget = 32 << 20
	inst := startIngest(t, func(c *Config) { c.DecodeMemoryBytes = budget })
	bombBytes := gzipped(t, 64<<20)
	runtime.GC()
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(sample)
	base := sample[0].Value.Uint64()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			rtmetrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
		}
	}()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				req, _ := http.NewRequest(http.MethodPost, inst.url+"/v1/events", bytes.NewReader(bombBytes))
				req.Header.Set("Authorization", "Bearer "+testKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Content-Encoding", "gzip")
				code := 0
				if resp, err := http.DefaultClient.Do(req); err == nil {
					if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
						code = -1
					} else {
						code = resp.StatusCode
					}
					resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	grown := int64(peak.Load()) - int64(base)
	t.Logf("50 × 4 bombs against a %d MiB budget: answers %v, heap grew by %.1f MiB at most", budget>>20, codes, float64(grown)/(1<<20))
	if codes[http.StatusRequestEntityTooLarge]+codes[http.StatusServiceUnavailable] != 200 || codes[http.StatusServiceUnavailable] == 0 {
		t.Errorf("answers %v: want only 413 and 503 with Retry-After, some 503", codes)
	}
	itest.Eventually(t, 30*time.Second, "the decode budget to be returned", func() bool {
		return inst.metric(t, "sluice_ingest_decode_memory_bytes") == 0
	})
	if grown > 2*budget {
		t.Errorf("the heap grew by %.1f MiB under bombs against a %d MiB budget, more than twice it", float64(grown)/(1<<20), budget>>20)
	}
}

// TestAttributeBombAnswerIsSmall: an 8 MiB event whose attributes are
// 700,000-odd invalid keys used to come back as a 72 MB rejection; the
// answer now names the count and the limit in a few kilobytes.
func TestAttributeBombAnswerIsSmall(t *testing.T) {
	inst := startIngest(t, nil)
	var b strings.Builder
	b.WriteString(`{"id":"bomb-1","time":"` + time.Now().UTC().Format(time.RFC3339) + `","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1,"attributes":{`)
	n := 0
	for ; b.Len() < 8<<20-64; n++ {
		if n > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%x ":""`, n) // a space: an invalid key
	}
	b.WriteString("}}")
	a := post(t, inst.url, testKey, "application/json", []byte(b.String()))
	if a.code != http.StatusBadRequest {
		t.Fatalf("attribute bomb: %d %.300s, want 400", a.code, a.raw)
	}
	if len(a.raw) > 16<<10 {
		t.Fatalf("the rejection of one event is %d bytes; want a few kilobytes", len(a.raw))
	}
	if !strings.Contains(a.raw, fmt.Sprintf("has %d entries", n)) || !strings.Contains(a.raw, "MaxAttributes") {
		t.Fatalf("the rejection does not name the count and the limit: %.500s", a.raw)
	}
}

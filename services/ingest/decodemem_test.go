package ingest

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"
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

// TestDecodeMemoryBudget: while one authenticated gzip body holds the whole
// decode_memory_bytes (it expanded to max_body_bytes and has not ended),
// another request gets 503 with Retry-After naming the setting instead of
// more memory; once the first ends, the budget is free again and the
// second goes through. 50 parallel 1 GiB-of-zeros bombs used to grow the
// process to 645 MB.
func TestDecodeMemoryBudget(t *testing.T) {
	const maxBody = 1 << 20
	inst := startIngest(t, func(c *Config) {
		c.MaxBodyBytes = maxBody
		c.DecodeMemoryBytes = decodeCostFactor * maxBody
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
	itest.Eventually(t, 30*time.Second, "the bomb to hold the whole decode budget", func() bool {
		return inst.metric(t, "sluice_ingest_decode_memory_bytes") >= decodeCostFactor*maxBody
	})

	body := []byte(batchJSON(eventJSON("dm-1", "acme")))
	a := post(t, inst.url, testKey, "application/json", body)
	if a.code != http.StatusServiceUnavailable || a.retryAfter == "" || !strings.Contains(a.body.Error, "decode_memory_bytes") {
		t.Fatalf("request while the budget is held: %d %s (Retry-After %q), want 503 naming decode_memory_bytes", a.code, a.raw, a.retryAfter)
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
		t.Fatalf("request after the budget was returned: %d %s, want 202", a.code, a.raw)
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

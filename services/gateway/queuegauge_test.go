package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestQueueLengthGaugeCountsWaitersByClass: with premium limited to one
// call in flight and that call held by its upstream, a low-priority
// request waits in premium's queue, and
// sluice_gateway_upstream_queue_length{upstream="premium",class="low"}
// says 1 (seed 000's queue length per class) while the other classes
// say 0; once the upstream answers, the queue is empty again.
func TestQueueLengthGaugeCountsWaitersByClass(t *testing.T) {
	release := make(chan struct{})
	held := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	}))
	t.Cleanup(held.Close)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	cfg := testConfig(t, Upstream{Name: "premium", BaseURL: held.URL + "/v1", Models: []string{"gpt-4o"}})
	g, _ := guardedGateway(t, cfg, `
tenants:
  acme: {priority: low}
upstreams:
  premium:
    concurrency: {mode: fixed, limit: 1, max: 1}
    queue: {max_waiting: 10, max_wait: 30s}
`, nil)
	queued := func(class string) float64 {
		return guardGauge(t, g.m, "sluice_gateway_upstream_queue_length", "premium", class)
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i, key := range []string{"sk-boss", "sk-acme"} {
		wg.Go(func() {
			// Not post: a goroutine must not end the test (t.Fatal).
			req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				codes[i] = resp.StatusCode
			}
		})
		if i == 0 {
			itest.Eventually(t, 10*time.Second, "the first call in flight", func() bool { return g.guards.Of("premium").Stats().InFlight == 1 })
		}
	}
	itest.Eventually(t, 10*time.Second, "the low request waiting", func() bool { return queued("low") == 1 })
	for _, c := range []string{"normal", "high", "critical"} {
		if n := queued(c); n != 0 {
			t.Errorf("queue_length{class=%s} = %v, want 0", c, n)
		}
	}
	once.Do(func() { close(release) })
	wg.Wait()
	if codes[0] != http.StatusOK || codes[1] != http.StatusOK {
		t.Fatalf("answers %v, want both 200", codes)
	}
	if n := queued("low"); n != 0 {
		t.Errorf("queue_length{class=low} = %v after the answers, want 0", n)
	}
}

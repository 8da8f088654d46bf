package gateway

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
)

// TestPolicyLimitsRefuseBeforeTheUpstream: a gateway run with
// admission.policy_file checks the policy's limits before each call: the
// call over acme's one-request-per-minute rule is answered 429 naming the
// rule, and the upstream never sees it.
func TestPolicyLimitsRefuseBeforeTheUpstream(t *testing.T) {
	url, upstreamCalls := admissionGateway(t, `
tenants:
  acme:
    limits:
      acme-rpm: {unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
`)
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	if resp, b := post(t, url, "/v1/chat/completions", "sk-acme", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("first call: %d %s", resp.StatusCode, b)
	}
	resp, b := post(t, url, "/v1/chat/completions", "sk-acme", body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(b, "acme-rpm") {
		t.Fatalf("second call: %d %v %s; want 429 with Retry-After naming acme-rpm", resp.StatusCode, resp.Header, b)
	}
	if n := upstreamCalls.Load(); n != 1 {
		t.Fatalf("the upstream saw %d calls; the refused one must not reach it", n)
	}
}

// TestLowPriorityWaitsForAPolicyLimit: a limit whose policy lets low
// priority wait holds a low request the bucket refuses until it refills,
// and the upstream serves it; a normal request (no wait for its class) and
// a low one whose caller's deadline is before the refill get the 429 at
// once.
func TestLowPriorityWaitsForAPolicyLimit(t *testing.T) {
	url, upstreamCalls := admissionGateway(t, `
tenants:
  acme:
    limits:
      acme-rps:
        unit: requests
        token_bucket: {rate: 1, per: 2s, burst: 1}
        exact: true
        wait: {low: 30s}
`)
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	if resp, b := post(t, url, "/v1/chat/completions", "sk-acme", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("first call: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, url, "/v1/chat/completions", "sk-acme", body, "X-Sluice-Priority", "low", "X-Sluice-Timeout-Ms", "100"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a low call due in 100 ms on a bucket refilling in 2 s: %d %s; want 429 at once", resp.StatusCode, b)
	}
	if resp, b := post(t, url, "/v1/chat/completions", "sk-acme", body, "X-Sluice-Priority", "low"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a low call that may wait 30 s: %d %s; want 200 once the bucket refilled", resp.StatusCode, b)
	}
	resp, b := post(t, url, "/v1/chat/completions", "sk-acme", body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, "acme-rps") {
		t.Fatalf("a normal call on the emptied bucket: %d %s; want 429 at once naming acme-rps", resp.StatusCode, b)
	}
	if n := upstreamCalls.Load(); n != 2 {
		t.Fatalf("the upstream saw %d calls, want 2 (the first and the low one that waited)", n)
	}
}

// admissionGateway runs a gateway in front of an upstream that answers
// every chat call, admitting each call by the limits of policyYAML (a wait
// of at most a second); it returns the gateway's URL and the count of the
// calls that reached the upstream.
func admissionGateway(t *testing.T, policyYAML string) (string, *atomic.Int64) {
	t.Helper()
	return limitsGateway(t, 1, policyYAML)
}

// limitsGateway starts a gateway whose one upstream answers every call
// with completion completion tokens, with policyYAML's limits checked on
// the real Redis under a prefix of the test's own. It returns the
// gateway's URL and the count of calls the upstream saw.
func limitsGateway(t *testing.T, completion int, policyYAML string, opts ...Option) (string, *atomic.Int64) {
	t.Helper()
	var upstreamCalls atomic.Int64
	answer := fmt.Sprintf(`{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`, completion, completion+5)
	mockUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(mockUp.Close)
	cfg := oneUpstream(t, mockUp.URL+"/v1")
	cfg.Listen = "127.0.0.1:0"
	cfg.policy = policyYAML
	cfg.Admission.MaxWait = time.Second
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Redis: itest.Redis(t),
		Policy: platform.FileSource{File: cfg.writePolicy(t), Reload: time.Second}, TenantKeys: platform.FileSource{File: writeKeys(t), Reload: time.Second}}
	svc, err := New(cfg.Config, env, opts...)
	return "http://" + itest.StartService(t, svc, err).Addr(), &upstreamCalls
}

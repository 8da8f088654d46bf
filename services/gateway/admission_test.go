package gateway

import (
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
	var upstreamCalls atomic.Int64
	mockUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	}))
	t.Cleanup(mockUp.Close)
	cfg := oneUpstream(t, mockUp.URL+"/v1")
	cfg.Listen = "127.0.0.1:0"
	cfg.policy = `
tenants:
  acme:
    limits:
      acme-rpm: {unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
`
	pol := cfg.writePolicy(t)
	cfg.Admission.MaxWait = time.Second
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Redis: itest.Redis(t),
		Policy: platform.FileSource{File: pol, Reload: time.Second}, TenantKeys: platform.FileSource{File: writeKeys(t), Reload: time.Second}}
	svc, err := New(cfg.Config, env)
	url := "http://" + itest.StartService(t, svc, err).Addr()
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

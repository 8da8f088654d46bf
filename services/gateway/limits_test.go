package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/gateway/admission"
	"github.com/sluicehq/sluice/gateway/middleware"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
)

// TestLimiterAdmitterRefusesBeforeTheCall: the gateway's admission hook
// backed by gateway/admission on the real Redis admits within a
// tokens-per-minute window, refuses the request that does not fit with
// 429, the rule named and Retry-After, and a settlement refunds what the
// estimate over-debited so the next request fits again.
func TestLimiterAdmitterRefusesBeforeTheCall(t *testing.T) {
	rc := itest.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	rules := &admission.Rules{Default: admission.TenantRules{Rules: []admission.Rule{{Name: "tpm", Unit: admission.TotalTokens,
		Algorithm: admission.SlidingWindow, Limit: 1000, Window: time.Minute, Exact: true}}}}
	l, err := admission.New(c, rules, admission.WithPrefix(itest.Unique(t, "sluice_test_gwadm:")), admission.WithMaxWait(2*time.Second),
		admission.WithRefusalCache(0)) // every decision from Redis: the refund must be seen at once
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	a := LimiterAdmitter{L: l}
	req := func(id string) AdmitRequest {
		return AdmitRequest{Tenant: "acme", Model: "gpt-4o-mini", APIKeyID: "k1", Endpoint: "/v1/chat/completions",
			EstimatePrompt: 500, EstimateCompletion: 200, Estimated: true, EventID: id}
	}
	first := a.Admit(context.Background(), req("c1"))
	if first.Refused != nil || first.Settle == nil || len(first.Limits) == 0 {
		t.Fatalf("first call: %+v", first)
	}
	second := a.Admit(context.Background(), req("c2"))
	if second.Refused == nil || second.Refused.Status != http.StatusTooManyRequests || second.Refused.RetryAfter <= 0 {
		t.Fatalf("second call (700 + 700 > 1000 tokens) not refused with 429 and Retry-After: %+v", second)
	}
	if msg := second.Refused.Error.Message; msg == "" || !strings.Contains(msg, "tpm") {
		t.Fatalf("refusal %q does not name the rule", msg)
	}
	// The first call used 100 tokens, not 700: settled, 900 are free.
	first.Settle(Settlement{Usage: middleware.Usage{PromptTokens: 80, CompletionTokens: 20}, Status: 200})
	if third := a.Admit(context.Background(), req("c3")); third.Refused != nil {
		t.Fatalf("after the settlement refunded 600 tokens the next call is still refused: %+v", third.Refused)
	}
}

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
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte(`
tenants:
  acme:
    limits:
      acme-rpm: {unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Admission.PolicyFile = pol
	cfg.Admission.KeyPrefix = itest.Unique(t, "sluice_test_gwpol:") + ":"
	cfg.Admission.MaxWait = time.Second
	cfg.Checker.KeyPrefix = itest.Unique(t, "sluice_test_gwflags:") + ":"
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Redis: itest.Redis(t)}
	addr, failed := make(chan string, 1), make(chan error, 1)
	itest.Start(t, "gateway", func(ctx context.Context) error {
		err := RunWith(ctx, cfg, env, Options{Started: func(a string) { addr <- a }})
		failed <- err
		return err
	})
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case err := <-failed:
		t.Fatalf("the gateway did not start: %v", err)
	}
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

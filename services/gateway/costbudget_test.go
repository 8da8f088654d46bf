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

// TestCostBudgetRefusesTheCallWhoseMaxTokensWouldCrossIt: each key of
// acme may spend $1 a month (a limit counting cost). gpt-4o-mini costs
// $1,000 per million completion tokens here, and every answer uses 500
// of them ($0.50). The first call, whose max_tokens 700 could cost $0.70,
// passes and settles at its real $0.50; the second, whose worst case
// would take the key to $1.20, is refused before the upstream sees it,
// 429 naming the budget and what is left; one with max_tokens 400 fits
// ($0.90) and passes; the tenant's other key carries on with a budget
// of its own.
func TestCostBudgetRefusesTheCallWhoseMaxTokensWouldCrossIt(t *testing.T) {
	var upstreamCalls atomic.Int64
	mockUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":500,"total_tokens":505}}`)
	}))
	t.Cleanup(mockUp.Close)
	cfg := oneUpstream(t, mockUp.URL+"/v1")
	cfg.Listen = "127.0.0.1:0"
	cfg.policy = `
prices:
  - {model: gpt-4o-mini, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 0, completion: 1000}
tenants:
  acme:
    limits:
      key-budget: {scope: {key: "*"}, unit: cost, period: {every: month, limit: 1}}
`
	pol := cfg.writePolicy(t)
	cfg.Admission.MaxWait = time.Second
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Redis: itest.Redis(t),
		Policy: platform.FileSource{File: pol, Reload: time.Second}, TenantKeys: platform.FileSource{File: writeKeys(t), Reload: time.Second}}
	env.Redis.KeyPrefix = itest.Unique(t, "costbudget") + ":"
	svc, err := New(cfg.Config, env)
	url := "http://" + itest.StartService(t, svc, err).Addr()
	call := func(key string, maxTokens string) (*http.Response, string) {
		return post(t, url, "/v1/chat/completions", key, `{"model":"gpt-4o-mini","max_tokens":`+maxTokens+`,"messages":[{"role":"user","content":"hi"}]}`)
	}

	if resp, b := call("sk-acme", "700"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a call of at most $0.70 against a $1 budget: %d %s", resp.StatusCode, b)
	}
	resp, b := call("sk-acme", "700")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, "key-budget") || !strings.Contains(b, "available 0.5,") {
		t.Fatalf("a call that could take the key to $1.20: %d %s; want 429 naming key-budget with 0.5 available", resp.StatusCode, b)
	}
	if n := upstreamCalls.Load(); n != 1 {
		t.Fatalf("the upstream saw %d calls; the refused one must not reach it", n)
	}
	if resp, b := call("sk-acme", "400"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a call of at most $0.40 with $0.50 left: %d %s", resp.StatusCode, b)
	}
	if resp, b := call("sk-boss", "700"); resp.StatusCode != http.StatusOK {
		t.Fatalf("acme's other key: %d %s; want its own budget", resp.StatusCode, b)
	}
}

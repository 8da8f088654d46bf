package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/itest/checkertest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

const guardPolicy = `
tenants:
  acme: {priority: high}
upstreams:
  premium:
    concurrency: {mode: fixed, limit: 4, max: 4}
    breaker: {consecutive_failures: 3, open_for: 1m}
  economy:
    concurrency: {mode: gradient, limit: 10, max: 50}
fallbacks:
  gpt-4o: [gpt-4o-mini]
`

// guardedGateway runs a gateway with cfg that follows the policy yaml: its
// tenants' classes, fallbacks and upstream guards, which count their
// shared state on rdb (nil: in this process) under a prefix of the
// test's own.
func guardedGateway(t *testing.T, cfg testGateway, yaml string, rdb redis.UniversalClient) (*gw, *Guards) {
	t.Helper()
	cfg.policy = yaml
	p := cfg.parsePolicy(t)
	guards := NewGuards(rdb, itest.Unique(t, "sluice_test_gwup:")+":", "test", nil, nil)
	t.Cleanup(guards.Close)
	if err := guards.Update(p); err != nil {
		t.Fatal(err)
	}
	return startGateway(t, cfg, Deps{Policy: func() *policy.Policy { return p }, Guards: guards}), guards
}

// TestBreakerOpenFallsBackToTheCheaperModel: the policy guards the
// premium upstream of gpt-4o; three failures in a row open its breaker,
// and from then on a gpt-4o request is served by the policy's fallback,
// gpt-4o-mini on the economy upstream — 200 with the served model named
// in X-Sluice-Served-Model, the settlement priced as gpt-4o-mini with
// requested_model gpt-4o and the tenant's class from the policy. A model
// without a fallback gets the breaker's 503 with Retry-After.
func TestBreakerOpenFallsBackToTheCheaperModel(t *testing.T) {
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	cfg := testConfig(t,
		Upstream{Name: "premium", BaseURL: failing.URL + "/v1", Models: []string{"gpt-4o", "gpt-4.1"}},
		Upstream{Name: "economy", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o-mini"}})
	g, guards := guardedGateway(t, cfg, guardPolicy, nil)
	chat := func(model, id string) (*http.Response, string) {
		return post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", id)
	}
	for i := range 3 {
		if resp, body := chat("gpt-4o", "fail-"+strconv.Itoa(i)); resp.StatusCode != http.StatusInternalServerError || resp.Header.Get(HeaderServedModel) != "gpt-4o" {
			t.Fatalf("call %d to the failing upstream: %d %s %v", i, resp.StatusCode, body, resp.Header)
		}
	}
	if st := guards.Of("premium").Stats().Breaker.State.String(); st != "open" {
		t.Fatalf("premium's breaker is %s after 3 failures in a row, want open", st)
	}
	resp, body := chat("gpt-4o", "fallback")
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o-mini" {
		t.Fatalf("with premium's breaker open: %d %s, served %q; want 200 from gpt-4o-mini", resp.StatusCode, body, resp.Header.Get(HeaderServedModel))
	}
	var answer struct{ Model string }
	if json.Unmarshal([]byte(body), &answer) != nil || answer.Model != "gpt-4o-mini" {
		t.Errorf("the upstream was not asked for the fallback model: %s", body)
	}
	ev := g.settlement(t, "fallback")
	if ev.Model != "gpt-4o-mini" || ev.RequestedModel != "gpt-4o" || ev.Provider != "economy" || ev.Priority != schemas.PriorityHigh ||
		ev.PromptTokens == 0 || ev.Outcome != schemas.OutcomeOK {
		t.Errorf("settlement of the fallback call: %+v; want model gpt-4o-mini, requested_model gpt-4o, provider economy, priority high, tokens", ev)
	}

	// gpt-4.1 has no fallback: the breaker's refusal, before any upstream call.
	resp, body = chat("gpt-4.1", "nofallback")
	var e ratelimit.Body
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != priority.BreakerOpen.String() {
		t.Fatalf("a model without fallback behind an open breaker: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if ev := g.settlement(t, "nofallback"); ev.Outcome != schemas.OutcomeRejected || ev.Attributes["refused_by"] != "breaker_open" || ev.PromptTokens != 0 {
		t.Errorf("settlement of the refused call: %+v", ev)
	}
}

// TestCallerDeadlineRefusesAtOnce: with X-Sluice-Timeout-Ms the caller
// gives its deadline. Upstream premium takes one call at a time and each
// has taken about 300 ms, so while one is in flight a request that may
// wait 50 ms is refused at once (503 deadline, the estimate in the body),
// and one that may wait 1.5 s waits and is refused when its deadline
// comes (503 expired) — not after the queue's own 60 s. A timeout that
// is not a number of milliseconds is a 400 naming the header.
func TestCallerDeadlineRefusesAtOnce(t *testing.T) {
	var hold atomic.Bool
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	slow := mockllm.New(mockllm.Options{Capacity: 1, Latency: 300 * time.Millisecond})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold.Load() {
			arrived <- struct{}{}
			<-release
		}
		slow.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	cfg := testConfig(t, Upstream{Name: "premium", BaseURL: up.URL + "/v1", Models: []string{"gpt-4o"}})
	g, _ := guardedGateway(t, cfg, `
upstreams:
  premium:
    concurrency: {mode: fixed, limit: 1, max: 1}
    queue: {max_wait: 60s}
`, nil)
	t.Cleanup(func() { close(release) }) // before the gateway's server closes
	const body = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	for i := range 2 { // the queue learns how long a call holds the slot
		if resp, b := post(t, g.url, "/v1/chat/completions", "sk-acme", body); resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if resp, b := post(t, g.url, "/v1/chat/completions", "sk-acme", body, priority.TimeoutHeader, "soon"); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(b, "invalid_timeout") || !strings.Contains(b, priority.TimeoutHeader) {
		t.Fatalf("a timeout that is no number: %d %s, want 400 invalid_timeout naming the header", resp.StatusCode, b)
	}

	hold.Store(true)
	first := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(authorized(g.url, body))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-arrived // the slot is taken until release

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	refusal := func(timeout string) (int, priority.Refusal, string) {
		req := authorized(g.url, body).WithContext(ctx)
		req.Header.Set(priority.TimeoutHeader, timeout)
		req.Header.Set("X-Request-Id", "deadline-"+timeout)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("timeout %s ms: %v (the gateway did not answer by the caller's deadline)", timeout, err)
		}
		defer resp.Body.Close()
		var e struct {
			Error struct {
				Code   string
				Sluice priority.Refusal
			}
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Sluice, e.Error.Code
	}
	if code, r, c := refusal("50"); code != http.StatusServiceUnavailable || c != "deadline" || r.EstimatedWaitMS < 50 {
		t.Fatalf("may wait 50 ms behind a 300 ms call: %d %s %+v; want 503 deadline at once with the estimate", code, c, r)
	}
	if code, r, c := refusal("1500"); code != http.StatusServiceUnavailable || c != "expired" || r.WaitedMS < 1000 {
		t.Fatalf("may wait 1.5 s behind a held call: %d %s %+v; want 503 expired after 1.5 s", code, c, r)
	}
	if ev := g.settlement(t, "deadline-50"); ev.Outcome != schemas.OutcomeRejected || ev.Attributes["refused_by"] != "deadline" {
		t.Errorf("settlement of the refusal: %+v", ev)
	}
	release <- struct{}{}
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the held call: %d", code)
	}
}

// authorized is a chat request with acme's key.
func authorized(url, body string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-acme")
	return req
}

// TestTokenShareSettledWithTheRealUsage: upstream premium's reserved
// shares count tokens per minute (capacity 1,000, saturation 50%, low a
// tenth, critical the rest) in Redis. A low call (the header lowers
// acme) is estimated at its max_tokens of 400 and more, but the provider
// bills 10: the gateway settles the share with the 10, so a second call
// of the same estimate passes. Had the estimate stayed counted, the two
// would make more than the 500 of the threshold and low, past its share,
// would be refused (as the third call, estimated at 800 alone, is).
func TestTokenShareSettledWithTheRealUsage(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":6,"completion_tokens":4,"total_tokens":10}}`)
	}))
	t.Cleanup(up.Close)
	cfg := testConfig(t, Upstream{Name: "premium", BaseURL: up.URL + "/v1", Models: []string{"gpt-4o"}})
	rdb := redisconn.NewClient(itest.Redis(t), redisconn.ContextTimeouts())
	t.Cleanup(func() { rdb.Close() })
	g, _ := guardedGateway(t, cfg, `
upstreams:
  premium:
    reserved: {unit: total_tokens, capacity: 1000, saturation: 0.5, shares: {critical: 0.9, low: 0.1}}
`, rdb)
	chat := func(maxTokens int) (*http.Response, string) {
		return post(t, g.url, "/v1/chat/completions", "sk-acme",
			fmt.Sprintf(`{"model":"gpt-4o","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens), priority.Header, "low")
	}
	for i := range 2 {
		if resp, b := chat(400); resp.StatusCode != http.StatusOK {
			t.Fatalf("low call %d estimated at 400+ tokens, billed 10: %d %s", i, resp.StatusCode, b)
		}
	}
	if resp, b := chat(800); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, "class_share") {
		t.Fatalf("a low call estimated past the threshold: %d %s, want 503 class_share", resp.StatusCode, b)
	}
}

// TestSoftQuotaFlagServesTheFallback: the enforcer flags acme soft on
// gpt-4o (a soft monthly quota past its limit: allowed, the overage
// billed). The gateway's Checker reads it from Redis; from then on
// acme's gpt-4o calls are answered 200 by the policy's fallback,
// gpt-4o-mini, named in X-Sluice-Served-Model, the settlement priced as
// gpt-4o-mini with requested_model gpt-4o. Before the flag, gpt-4o served.
func TestSoftQuotaFlagServesTheFallback(t *testing.T) {
	cfg := testConfig(t, Upstream{Name: "mock", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o", "gpt-4o-mini"}})
	cfg.policy = "fallbacks:\n  gpt-4o: [gpt-4o-mini]\n"
	chk, setSoft := softFlagChecker(t)
	g := startGateway(t, cfg, Deps{Checker: chk})
	chat := func(id string) (*http.Response, string) {
		return post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", id)
	}
	if resp, b := chat("before"); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o" {
		t.Fatalf("before the soft flag: %d %s %v", resp.StatusCode, b, resp.Header)
	}

	setSoft(true, 1)
	if d := chk.Check("acme", "gpt-4o", "acme"); !d.Allowed() {
		t.Fatalf("a soft flag refused: %+v", d)
	}
	resp, b := chat("soft")
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o-mini" {
		t.Fatalf("past the soft quota: %d %s, served %q; want 200 from gpt-4o-mini", resp.StatusCode, b, resp.Header.Get(HeaderServedModel))
	}
	if ev := g.settlement(t, "soft"); ev.Model != "gpt-4o-mini" || ev.RequestedModel != "gpt-4o" || ev.Outcome != schemas.OutcomeOK || ev.PromptTokens == 0 {
		t.Errorf("settlement: %+v; want model gpt-4o-mini, requested_model gpt-4o", ev)
	}
	if chk.Over("acme", "gpt-4o-mini", "acme") != nil || chk.Over("trial", "gpt-4o", "mini-only") != nil {
		t.Error("the soft flag on acme's gpt-4o applies to another model or tenant")
	}
}

// softFlagChecker returns a Checker on the test Redis and a function that
// raises (on) or lifts acme's soft monthly-quota flag on gpt-4o at flag
// version version, as the enforcer writes it, and waits until the Checker
// has the change.
func softFlagChecker(t *testing.T) (*checker.Checker, func(on bool, version int)) {
	t.Helper()
	rdb := redisconn.NewClient(itest.Redis(t))
	t.Cleanup(func() { rdb.Close() })
	ccfg := checker.DefaultConfig()
	ccfg.KeyPrefix = itest.Unique(t, "sluice_test_gwflags:") + ":"
	ccfg.ResyncInterval = time.Second
	chk := checkertest.Start(t, rdb, ccfg)
	layout := flags.Layout{Prefix: ccfg.KeyPrefix}
	t.Cleanup(func() { rdb.Del(context.Background(), layout.TenantKey("acme"), layout.VersionKey()) })
	return chk, func(on bool, version int) {
		t.Helper()
		ctx := context.Background()
		end := time.Now().Add(time.Hour)
		f := &flags.Flag{State: flags.StateSoft, Kind: flags.KindQuota, Quota: "monthly_tokens", Period: "month", Limit: 1000, Used: 1200, Until: end, ResetsAt: end}
		if _, err := rdb.TxPipelined(ctx, func(pl redis.Pipeliner) error {
			if on {
				pl.HSet(ctx, layout.TenantKey("acme"), flags.VersionField, version, "gpt-4o", flags.Encode(f))
				pl.PExpire(ctx, layout.TenantKey("acme"), time.Hour)
			} else {
				pl.Del(ctx, layout.TenantKey("acme"))
			}
			pl.Set(ctx, layout.VersionKey(), version, 0)
			pl.Publish(ctx, layout.Channel(), flags.FormatChange("acme", int64(version)))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		itest.Eventually(t, 30*time.Second, "the Checker reads the soft flag's change", func() bool { return (chk.Over("acme", "gpt-4o", "acme") != nil) == on })
	}
}

// routeLimits builds the gateway's admission (frontend.NewLimits, as
// `sluice gateway` does) for cfg's policy on the test Redis under a
// prefix of the test's own.
func routeLimits(t *testing.T, cfg testGateway) *frontend.Limits {
	t.Helper()
	rc := itest.Redis(t)
	rc.KeyPrefix = itest.Unique(t, "sluice_test_gwroute:") + ":"
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Redis: rc}
	limits, err := frontend.NewLimits(frontend.DefaultAdmission(), cfg.parsePolicy(t), "gateway", true, env, env.Logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(limits.Close)
	return limits
}

// TestUpstreamScopedLimitsCountWhatEachUpstreamServes: a limit scoped by
// an upstream (a provider account's requests per minute) counts the calls
// the gateway sends there, once it has chosen the upstream: with two
// accounts of one request a minute each, two calls are served, one by
// each, and the third is refused with 429 naming a limit.
func TestUpstreamScopedLimitsCountWhatEachUpstreamServes(t *testing.T) {
	up := mock(t, mockllm.Options{})
	cfg := testConfig(t, Upstream{Name: "acct-a", BaseURL: up, Models: []string{"gpt-4o"}}, Upstream{Name: "acct-b", BaseURL: up, Models: []string{"gpt-4o"}})
	cfg.policy = `
limits:
  acct-a-rpm: {scope: {upstream: acct-a}, unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
  acct-b-rpm: {scope: {upstream: acct-b}, unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
`
	g := startGateway(t, cfg, Deps{Limits: routeLimits(t, cfg)})
	served := map[string]int{}
	for i := range 3 {
		resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", fmt.Sprint("acct-", i))
		switch {
		case i < 2 && resp.StatusCode == http.StatusOK:
			served[g.settlement(t, fmt.Sprint("acct-", i)).Provider]++
		case i == 2 && resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" && strings.Contains(body, "-rpm"):
		default:
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if served["acct-a"] != 1 || served["acct-b"] != 1 {
		t.Errorf("served %v, want one call by each account", served)
	}
}

// TestFallbackChargesTheServedModelsLimits: a call a fallback model serves
// is charged to the served model's limits, not the requested one's.
// acme may make one gpt-4o and one gpt-4o-mini call a minute; past a soft
// quota its gpt-4o call is served by gpt-4o-mini, which uses mini's one
// call: a gpt-4o call still passes once the soft flag is gone, and a
// gpt-4o-mini call is refused.
func TestFallbackChargesTheServedModelsLimits(t *testing.T) {
	cfg := testConfig(t, Upstream{Name: "mock", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o", "gpt-4o-mini"}})
	cfg.policy = `
fallbacks:
  gpt-4o: [gpt-4o-mini]
tenants:
  acme:
    limits:
      big-rpm: {scope: {model: gpt-4o}, unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
      mini-rpm: {scope: {model: gpt-4o-mini}, unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
`
	chk, setSoft := softFlagChecker(t)
	g := startGateway(t, cfg, Deps{Checker: chk, Limits: routeLimits(t, cfg)})
	chat := func(model, id string) (*http.Response, string) {
		return post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", id)
	}

	setSoft(true, 1)
	if resp, b := chat("gpt-4o", "fallback"); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o-mini" {
		t.Fatalf("past the soft quota: %d %s, served %q; want 200 from gpt-4o-mini", resp.StatusCode, b, resp.Header.Get(HeaderServedModel))
	}
	setSoft(false, 2)
	if resp, b := chat("gpt-4o", "big"); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o" {
		t.Fatalf("gpt-4o after the fallback call: %d %s; want 200 (the fallback call was not gpt-4o's)", resp.StatusCode, b)
	}
	if resp, b := chat("gpt-4o-mini", "mini"); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, "mini-rpm") {
		t.Fatalf("gpt-4o-mini after the fallback call: %d %s; want 429 naming mini-rpm (the fallback call was mini's)", resp.StatusCode, b)
	}
}

// TestRateLimitHeadersOnEveryAnswerALimitAppliesTo: with a limit on the
// tenant, its answers carry OpenAI's x-ratelimit-* headers whatever they
// are — served, the provider's error, refused by the limit — and a tenant
// no limit applies to gets none.
func TestRateLimitHeadersOnEveryAnswerALimitAppliesTo(t *testing.T) {
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"down"}}`, http.StatusInternalServerError)
	}))
	defer failing.Close()
	cfg := testConfig(t, Upstream{Name: "mock", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o"}},
		Upstream{Name: "broken", BaseURL: failing.URL + "/v1", Models: []string{"o3"}})
	cfg.policy = `
tenants:
  acme:
    limits:
      acme-rpm: {unit: requests, sliding_window: {length: 1m, limit: 2}, exact: true}
`
	g := startGateway(t, cfg, Deps{Limits: routeLimits(t, cfg)})
	for _, c := range []struct {
		key, model string
		status     int
		headers    bool
	}{
		{"sk-acme", "gpt-4o", http.StatusOK, true},
		{"sk-acme", "o3", http.StatusInternalServerError, true},
		{"sk-acme", "gpt-4o", http.StatusTooManyRequests, true},
		{"sk-mini-only", "gpt-4o-mini", http.StatusNotFound, false}, // no upstream serves it, no limit
	} {
		resp, body := post(t, g.url, "/v1/chat/completions", c.key, `{"model":"`+c.model+`","messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s: %d %s, want %d", c.key, c.model, resp.StatusCode, body, c.status)
		}
		if got := resp.Header.Get("X-Ratelimit-Limit-Requests") != ""; got != c.headers {
			t.Errorf("%s %s (%d): x-ratelimit-limit-requests present %t, want %t: %v", c.key, c.model, c.status, got, c.headers, resp.Header)
		}
	}
}

package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/gateway/priority"
	"github.com/sluicehq/sluice/gateway/ratelimit"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
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
	p, err := policy.Parse([]byte(guardPolicy), "guard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	guards := NewGuards(nil, "unused:", "test", nil, nil)
	t.Cleanup(guards.Close)
	if err := guards.Update(p); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, cfg, Deps{Policy: func() *policy.Policy { return p }, Guards: guards})
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
	ev := g.sink.settlement(t, "fallback")
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
	if ev := g.sink.settlement(t, "nofallback"); ev.Outcome != schemas.OutcomeRejected || ev.Attributes["refused_by"] != "breaker_open" || ev.PromptTokens != 0 {
		t.Errorf("settlement of the refused call: %+v", ev)
	}
}

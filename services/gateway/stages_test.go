package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// The tests of this file take the proxy's stages one at a time (proxy.go):
// each gets a call in the state the stage before leaves it and is judged
// by what it answers and what it leaves in the call.

// apiRequest is a POST to the chat completions endpoint with key and body.
func apiRequest(key, body string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

// errorCode is the code of the OpenAI error body w holds.
func errorCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var b ratelimit.Body
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
		t.Fatalf("answer %d is no OpenAI error: %s", w.Code, w.Body)
	}
	return b.Error.Code
}

// TestIntakeRefusesWhatItCannotServe: the intake stage answers every
// request it cannot hand on with OpenAI's error naming the problem, and
// ends the call rejected with that code; a request it can serve leaves the
// call its caller, routes, class and user.
func TestIntakeRefusesWhatItCannotServe(t *testing.T) {
	g := startGateway(t, testConfig(t, Upstream{Name: "mock", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"gpt-4o", "gpt-4o-mini*"}}), Deps{})
	for _, tc := range []struct {
		name, key, body string
		header          []string
		status          int
		code            string
	}{
		{"no key", "", `{"model":"gpt-4o"}`, nil, 401, "invalid_api_key"},
		{"unknown key", "sk-nobody", `{"model":"gpt-4o"}`, nil, 401, "invalid_api_key"},
		{"not JSON", "sk-acme", `{"model":`, nil, 400, "invalid_json"},
		{"no model", "sk-acme", `{"messages":[]}`, nil, 400, "missing_model"},
		{"model the key may not use", "sk-mini-only", `{"model":"gpt-4o"}`, nil, 403, "model_not_allowed"},
		{"model no upstream serves", "sk-acme", `{"model":"claude-3"}`, nil, 404, "model_not_found"},
		{"raised priority", "sk-acme", `{"model":"gpt-4o"}`, []string{priority.Header, "critical"}, 403, "priority_not_allowed"},
		{"unknown priority", "sk-acme", `{"model":"gpt-4o"}`, []string{priority.Header, "urgent"}, 400, "invalid_priority"},
		{"bad deadline", "sk-acme", `{"model":"gpt-4o"}`, []string{priority.TimeoutHeader, "soon"}, 400, "invalid_timeout"},
	} {
		w, c := httptest.NewRecorder(), &call{}
		if g.intake(w, apiRequest(tc.key, tc.body, tc.header...), c) {
			t.Errorf("%s: intake let it through", tc.name)
			continue
		}
		if w.Code != tc.status || errorCode(t, w) != tc.code || c.outcome != schemas.OutcomeRejected || c.code != tc.code {
			t.Errorf("%s: answered %d %s, call ended %q/%q; want %d %s, rejected", tc.name, w.Code, errorCode(t, w), c.outcome, c.code, tc.status, tc.code)
		}
	}

	w, c := httptest.NewRecorder(), &call{}
	if !g.intake(w, apiRequest("sk-boss", `{"model":"gpt-4o-mini-2024","user":"u1"}`, priority.Header, "critical"), c) {
		t.Fatalf("a request it can serve: %d %s", w.Code, w.Body)
	}
	if c.caller.KeyID != "boss" || len(c.ups) != 1 || c.route != "gpt-4o-mini*" || c.priority != schemas.PriorityCritical || c.user != "u1" || c.ended {
		t.Errorf("intake left caller %s, %d upstreams on route %q, priority %q, user %q, ended %v", c.caller.KeyID, len(c.ups), c.route, c.priority, c.user, c.ended)
	}
}

// admitterFunc is an Admitter of a function.
type admitterFunc func(frontend.AdmitRequest) frontend.Admission

func (f admitterFunc) Admit(_ context.Context, r frontend.AdmitRequest) frontend.Admission {
	return f(r)
}

// stagedCall is a call as intake and the middleware leave it for the
// proxy: tenant acme asking for model.
func stagedCall(t *testing.T, g *gw, model string) *call {
	t.Helper()
	c := &call{endpoint: "/v1/chat/completions"}
	if !g.intake(httptest.NewRecorder(), apiRequest("sk-acme", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`), c) {
		t.Fatal("intake refused the staged call")
	}
	c.mc, c.eventID = &middleware.Call{}, "ev-1"
	return c
}

// TestAdmitRefusesOrRegistersItsSettlement: the admit stage answers a
// refusal as the Admitter says (status, body naming the rule, headers)
// and ends the call rejected; an admitted call's settlement is registered
// to run once the call ends, and the models that may serve it come back
// in order, the asked one first.
func TestAdmitRefusesOrRegistersItsSettlement(t *testing.T) {
	tg := testConfig(t, Upstream{Name: "mock", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"*"}})
	tg.policy = "fallbacks:\n  gpt-4o: [gpt-4o-mini]\n"
	refuse := true
	var settled []frontend.Settlement
	adm := admitterFunc(func(r frontend.AdmitRequest) frontend.Admission {
		if r.Tenant != "acme" || r.Model != "gpt-4o" || r.EventID != "ev-1" || r.EstimatePrompt != 10 {
			t.Errorf("admission asked %+v", r)
		}
		if refuse {
			return frontend.Admission{Refused: &frontend.Refusal{Status: 429, RetryAfter: 7 * time.Second,
				Error: ratelimit.Error{Type: "tokens", Code: "rate_limit_exceeded", Message: "acme-tpm"}, Rule: "acme-tpm"}}
		}
		return frontend.Admission{Settle: func(s frontend.Settlement) { settled = append(settled, s) }}
	})
	g := startGateway(t, tg, Deps{Limits: &frontend.Limits{Admit: adm}})
	est := estimate.Estimate{Prompt: 10, Completion: 5}

	w, c := httptest.NewRecorder(), stagedCall(t, g, "gpt-4o")
	st := &settlement{c: c, est: est}
	if _, ok := g.admit(w, httptest.NewRequest("POST", "/", nil), c, est, true, st); ok {
		t.Fatal("a refused call was admitted")
	}
	if w.Code != 429 || w.Header().Get("Retry-After") != "7" || c.outcome != schemas.OutcomeRejected || c.code != "rate_limit_exceeded" || len(st.settles) != 0 {
		t.Errorf("refusal: %d %v, call %q/%q, %d settles", w.Code, w.Header(), c.outcome, c.code, len(st.settles))
	}

	refuse = false
	w, c = httptest.NewRecorder(), stagedCall(t, g, "gpt-4o")
	st = &settlement{c: c, est: est}
	models, ok := g.admit(w, httptest.NewRequest("POST", "/", nil), c, est, true, st)
	if !ok || strings.Join(models, ",") != "gpt-4o,gpt-4o-mini" || c.ended {
		t.Fatalf("admitted: %v %v, ended %v", models, ok, c.ended)
	}
	c.usage, c.source = middleware.Usage{PromptTokens: 8, CompletionTokens: 3}, usageReported
	st.status = 200
	st.run()
	if len(settled) != 1 || settled[0].Usage.PromptTokens != 8 || settled[0].Status != 200 || settled[0].Outcome != schemas.OutcomeOK {
		t.Errorf("settlements after the call: %+v; want one, with the reported usage", settled)
	}
}

// TestDispatchFailsOverThenFallsBack: the dispatch stage moves on to the
// model's next upstream when one fails (5xx), counting attempts; when the
// asked model's only upstream's breaker is open it hands the call to the
// fallback model's upstream; when nothing can take it, it reports the
// guard's refusal without calling anyone.
func TestDispatchFailsOverThenFallsBack(t *testing.T) {
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	t.Cleanup(failing.Close)
	ok := mock(t, mockllm.Options{})
	tg := testConfig(t,
		Upstream{Name: "first", BaseURL: failing.URL + "/v1", Models: []string{"gpt-4o"}, Weight: 1000},
		Upstream{Name: "second", BaseURL: ok, Models: []string{"gpt-4o"}, Weight: 1},
		Upstream{Name: "premium", BaseURL: failing.URL + "/v1", Models: []string{"o3"}},
		Upstream{Name: "cheap", BaseURL: ok, Models: []string{"o3-mini"}})
	tg.policy = `
upstreams:
  first: {breaker: {consecutive_failures: 1000, error_ratio: 0}}
  premium: {breaker: {consecutive_failures: 1, error_ratio: 0, open_for: 1m}}
fallbacks:
  o3: [o3-mini]
`
	tg.MaxAttempts = 2
	g, _ := guardedGateway(t, tg, tg.policy, nil)
	est := estimate.Estimate{Prompt: 10, Completion: 5}

	// The failing upstream wins the weighted draw almost always; when it
	// does, the call fails over to the second.
	for range 5 {
		c := stagedCall(t, g, "gpt-4o")
		ex := g.dispatch(context.Background(), httptest.NewRecorder(), http.Header{}, c, []string{"gpt-4o"}, &settlement{c: c, est: est})
		if ex.resp == nil || ex.resp.StatusCode != 200 || ex.provider.cfg.Name != "second" || c.attempts < 1 {
			t.Fatalf("failover: status %d from %s after %d attempts", ex.resp.StatusCode, ex.provider.cfg.Name, c.attempts)
		}
		ex.resp.Body.Close()
		ex.done()
		ex.permit.Release(0)
		if c.attempts == 2 {
			break
		}
	}

	// premium fails once and its breaker opens; then o3 is served by o3-mini.
	c := stagedCall(t, g, "o3")
	ex := g.dispatch(context.Background(), httptest.NewRecorder(), http.Header{}, c, []string{"o3", "o3-mini"}, &settlement{c: c, est: est})
	if ex.resp == nil || ex.resp.StatusCode != http.StatusBadGateway || ex.model != "o3" {
		t.Fatalf("premium's failure is relayed when it is the last upstream: %+v", ex)
	}
	ex.resp.Body.Close()
	ex.done()
	ex.permit.Release(outcomeOf(ex.resp.StatusCode, nil, false))
	c = stagedCall(t, g, "o3")
	ex = g.dispatch(context.Background(), httptest.NewRecorder(), http.Header{}, c, []string{"o3", "o3-mini"}, &settlement{c: c, est: est})
	if ex.resp == nil || ex.model != "o3-mini" || ex.provider.cfg.Name != "cheap" {
		t.Fatalf("with premium's breaker open: %+v, want o3-mini on cheap", ex)
	}
	ex.resp.Body.Close()
	ex.done()
	ex.permit.Release(0)

	// Without a fallback the guard's refusal comes back, and nobody was called.
	c = stagedCall(t, g, "o3")
	ex = g.dispatch(context.Background(), httptest.NewRecorder(), http.Header{}, c, []string{"o3"}, &settlement{c: c, est: est})
	if ex.resp != nil || ex.refused == nil || ex.refused.Reason != priority.BreakerOpen || c.attempts != 0 {
		t.Fatalf("no fallback: %+v after %d attempts, want the breaker's refusal", ex, c.attempts)
	}
}

// TestRelayReadsWhatTheCallUsed: the relay stage passes a plain answer
// on and reads its usage; an answer that is not JSON is settled at the
// estimate; an answer that breaks off is settled at zero, as the
// provider's error; a provider's 4xx is relayed as it is, at zero.
func TestRelayReadsWhatTheCallUsed(t *testing.T) {
	g := startGateway(t, oneUpstream(t, "http://127.0.0.1:1/v1"), Deps{})
	answer := func(status int, body io.Reader) exchange {
		return exchange{resp: &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(body)},
			done: func() {}, model: "gpt-4o"}
	}
	relay := func(ex exchange) (*httptest.ResponseRecorder, *call) {
		c := stagedCall(t, g, "gpt-4o")
		w := httptest.NewRecorder()
		g.relay(w, httptest.NewRequest("POST", "/", nil), c, &settlement{c: c}, ex, estimate.Estimate{Request: estimate.Request{PromptTokens: 4}}, true)
		return w, c
	}

	w, c := relay(answer(200, strings.NewReader(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}`)))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "hi") || c.source != usageReported || c.usage.PromptTokens != 12 || c.usage.CachedTokens != 2 || c.outcome != schemas.OutcomeOK {
		t.Errorf("a plain answer: %d, source %s, usage %+v, outcome %q", w.Code, c.source, c.usage, c.outcome)
	}
	_, c = relay(answer(200, strings.NewReader(`not json`)))
	if c.source != usageEstimate {
		t.Errorf("a 2xx that is not JSON: source %s, want estimate", c.source)
	}
	_, c = relay(answer(200, io.MultiReader(strings.NewReader(`{"choices":[`), errReader{})))
	if c.source != usageNone || c.outcome != schemas.OutcomeError || c.code != codeStreamCut {
		t.Errorf("an answer that broke off: source %s, call %q/%q; want none, error", c.source, c.outcome, c.code)
	}
	w, c = relay(answer(400, strings.NewReader(`{"error":{"message":"bad"}}`)))
	if w.Code != 400 || !strings.Contains(w.Body.String(), "bad") || c.source != usageNone || c.outcome != schemas.OutcomeOK || c.code != "upstream_400" {
		t.Errorf("a provider's 400: %d %s, source %s, call %q/%q", w.Code, w.Body, c.source, c.outcome, c.code)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// TestSettlementGivesBackWhatTheCallUsed: settle gives each admission the
// call's settlement — the provider's usage when it reported some, the
// estimate when the answer could not be read, nothing when no call was
// billed — last registered first, with the outcome of how the call ended
// (none for a client that left).
func TestSettlementGivesBackWhatTheCallUsed(t *testing.T) {
	est := estimate.Estimate{Prompt: 100, Completion: 50}
	for _, tc := range []struct {
		name   string
		source usageSource
		end    func(*call)
		status int
		want   frontend.Settlement
	}{
		{"reported", usageReported, func(c *call) { c.end(schemas.OutcomeOK, "") }, 200,
			frontend.Settlement{Usage: middleware.Usage{PromptTokens: 7, CompletionTokens: 2}, Outcome: schemas.OutcomeOK, Status: 200}},
		{"estimate", usageEstimate, func(c *call) { c.end(schemas.OutcomeOK, "") }, 200,
			frontend.Settlement{Usage: middleware.Usage{PromptTokens: 100, CompletionTokens: 50}, Outcome: schemas.OutcomeOK, Status: 200}},
		{"timeout", usageNone, func(c *call) { c.end(schemas.OutcomeTimeout, "upstream_timeout") }, 504,
			frontend.Settlement{Outcome: schemas.OutcomeTimeout, Status: 504}},
		{"client left", usageCounted, func(c *call) { c.end("", codeClientClosed) }, 200,
			frontend.Settlement{Usage: middleware.Usage{PromptTokens: 7, CompletionTokens: 2}, Status: 200}},
	} {
		c := &call{mc: &middleware.Call{}, source: tc.source, usage: middleware.Usage{PromptTokens: 7, CompletionTokens: 2}}
		tc.end(c)
		var order []string
		var got []frontend.Settlement
		st := &settlement{c: c, est: est, status: tc.status}
		st.add(func(s frontend.Settlement) { order, got = append(order, "admission"), append(got, s) })
		st.add(nil)
		st.add(func(frontend.Settlement) { order = append(order, "soft") })
		st.run()
		if strings.Join(order, ",") != "soft,admission" || len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: settled %v with %+v; want soft then admission with %+v", tc.name, order, got, tc.want)
		}
	}
}

// TestIntakeRefusesUnpricedModelsForRefuseTenantsWithABudget: a tenant
// with a money budget and unpriced: refuse gets 403 model_unpriced,
// naming the model and the setting, for a model without a price, and is
// served a priced one; under unpriced: fallback the same call passes.
func TestIntakeRefusesUnpricedModelsForRefuseTenantsWithABudget(t *testing.T) {
	const priced = "price_catalog: none\nprices:\n  - {model: house, currency: USD, effective_from: 2020-01-01T00:00:00Z, prompt: 1, completion: 2}\n"
	for _, tc := range []struct {
		unpriced, model string
		refused         bool
	}{{"refuse", "mystery", true}, {"refuse", "house", false}, {"fallback", "mystery", false}} {
		tg := testConfig(t, Upstream{Name: "mock", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"*"}})
		tg.policy = priced + "tenants:\n  acme: {unpriced: " + tc.unpriced + ", budget: {amount: 10, currency: USD}}\n"
		g := startGateway(t, tg, Deps{})
		w, c := httptest.NewRecorder(), &call{}
		passed := g.intake(w, apiRequest("sk-acme", `{"model":"`+tc.model+`"}`), c)
		if passed == tc.refused {
			t.Errorf("unpriced: %s, model %s: passed %v, want refused %v (%d %s)", tc.unpriced, tc.model, passed, tc.refused, w.Code, w.Body)
			continue
		}
		if tc.refused && (w.Code != 403 || errorCode(t, w) != "model_unpriced" || !strings.Contains(w.Body.String(), "unpriced: refuse")) {
			t.Errorf("refusal %d %s, want 403 model_unpriced naming unpriced: refuse", w.Code, w.Body)
		}
	}
}

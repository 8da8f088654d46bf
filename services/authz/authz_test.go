package authz

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// testKeysFile writes the test keys file: each key's secret is "sk-" +
// its id, its tenant its id; "mini" may use only gpt-4o-mini, "boss" may
// set its priority.
func testKeysFile(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("keys:\n")
	for _, id := range []string{"acme", "blocked", "trial", "strict"} {
		b.WriteString(frontend.KeyLine(id, "sk-"+id, id, nil))
	}
	b.WriteString(frontend.KeyLine("mini", "sk-mini", "acme", []string{"gpt-4o-mini"}))
	b.WriteString(strings.Replace(frontend.KeyLine("boss", "sk-boss", "acme", nil), "}", ", may_set_priority: true}", 1))
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testKeys opens the test keys file (testKeysFile).
func testKeys(t testing.TB) *keyfile.File[frontend.Caller] {
	t.Helper()
	f, err := frontend.OpenKeys(testKeysFile(t), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// openAIError decodes an OpenAI error answer and checks that the
// X-Sluice-Error header, when the answer went through nginx's rewrite or
// not, is the same document.
func openAIError(t *testing.T, resp *http.Response, body string) ratelimit.Error {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("refusal %d answered with Content-Type %q, want application/json: %s", resp.StatusCode, ct, body)
	}
	var b ratelimit.Body
	if err := json.Unmarshal([]byte(body), &b); err != nil || b.Error.Message == "" || b.Error.Code == "" {
		t.Fatalf("refusal %d body is not an OpenAI error (%v): %s", resp.StatusCode, err, body)
	}
	return b.Error
}

// fakeDecider answers from a fixed map of tenant to decision.
type fakeDecider map[string]checker.Decision

func (f fakeDecider) Check(tenant, _, _ string) checker.Decision { return f[tenant] }

// fakeAdmitter records what it was asked and answers ans.
type fakeAdmitter struct {
	mu   sync.Mutex
	reqs []frontend.AdmitRequest
	ans  frontend.Admission
}

func (f *fakeAdmitter) Admit(_ context.Context, req frontend.AdmitRequest) frontend.Admission {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return f.ans
}

// answer sets what the next admissions answer.
func (f *fakeAdmitter) answer(a frontend.Admission) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ans = a
}

func (f *fakeAdmitter) asked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

func (f *fakeAdmitter) last(t *testing.T) frontend.AdmitRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("admission was not asked")
	}
	return f.reqs[len(f.reqs)-1]
}

func newServer(t *testing.T, cfg Config, deps Deps) *httptest.Server {
	t.Helper()
	deps.Logger = slog.New(slog.DiscardHandler)
	s, err := NewServer(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return hs
}

// ask sends a check as a proxy would: method GET, the given path and
// headers (name, value pairs).
func ask(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	return itest.Send(t, http.MethodGet, url, "", header...)
}

// refusedAs checks a refusal's status and code, and that X-Sluice-Error
// is its body, in ASCII.
func refusedAs(t *testing.T, resp *http.Response, body string, status int, code string) ratelimit.Error {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	e := openAIError(t, resp, body)
	if e.Code != code {
		t.Fatalf("code %q, want %q: %s", e.Code, code, body)
	}
	h := resp.Header.Get(HeaderError)
	for i := 0; i < len(h); i++ {
		if h[i] < 0x20 || h[i] > 0x7e {
			t.Fatalf("%s carries a byte outside printable ASCII: %q", HeaderError, h)
		}
	}
	var fromHeader, fromBody any
	if err := json.Unmarshal([]byte(h), &fromHeader); err != nil {
		t.Fatalf("%s is not JSON (%v): %q", HeaderError, err, h)
	}
	_ = json.Unmarshal([]byte(body), &fromBody)
	a, _ := json.Marshal(fromHeader)
	b, _ := json.Marshal(fromBody)
	if string(a) != string(b) {
		t.Fatalf("%s says %s, the body %s", HeaderError, a, b)
	}
	return e
}

func TestKeysDecideWhoCallsWhichModel(t *testing.T) {
	adm := &fakeAdmitter{}
	hs := newServer(t, DefaultConfig(), Deps{Admitter: adm, Keys: testKeys(t)})

	resp, body := ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-acme", "X-Sluice-Model", "gpt-4o")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Sluice-Tenant") != "acme" || resp.Header.Get("X-Sluice-Key-Id") != "acme" {
		t.Fatalf("a valid key: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// A client cannot choose its tenant when keys decide.
	resp, _ = ask(t, hs.URL+"/authz", "Authorization", "sk-trial", "X-Sluice-Tenant", "acme")
	if resp.Header.Get("X-Sluice-Tenant") != "trial" || adm.last(t).Tenant != "trial" {
		t.Fatalf("a bare key of tenant trial sending X-Sluice-Tenant: acme was charged to %q", adm.last(t).Tenant)
	}

	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-wrong")
	refusedAs(t, resp, body, http.StatusUnauthorized, "invalid_api_key")
	resp, body = ask(t, hs.URL+"/authz")
	refusedAs(t, resp, body, http.StatusUnauthorized, "invalid_api_key")

	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-mini", "X-Sluice-Model", "gpt-4o")
	refusedAs(t, resp, body, http.StatusForbidden, "model_not_allowed")
	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-mini")
	if e := refusedAs(t, resp, body, http.StatusForbidden, "model_not_allowed"); !strings.Contains(e.Message, "X-Sluice-Model") {
		t.Fatalf("a model-limited key without a model: %q does not say which header to send", e.Message)
	}
	if resp, body := ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-mini", "X-Sluice-Model", "gpt-4o-mini"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the model the key may use: %d %s", resp.StatusCode, body)
	}

	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-acme", "X-Sluice-Priority", "critical")
	refusedAs(t, resp, body, http.StatusForbidden, "priority_not_allowed")
	if resp, body := ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-boss", "X-Sluice-Priority", "critical"); resp.StatusCode != http.StatusOK || adm.last(t).Priority != "critical" {
		t.Fatalf("a key that may set its priority: %d %s, admission saw %q", resp.StatusCode, body, adm.last(t).Priority)
	}
	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-boss", "X-Sluice-Priority", "urgent")
	refusedAs(t, resp, body, http.StatusBadRequest, "invalid_priority")
}

func TestHeadersNameTheTenantWithoutKeys(t *testing.T) {
	adm := &fakeAdmitter{}
	hs := newServer(t, DefaultConfig(), Deps{Admitter: adm})
	resp, body := ask(t, hs.URL+"/authz", "X-Sluice-Tenant", "acme", "X-Sluice-Key-Id", "k1", "X-Sluice-Model", "gpt-4o",
		"X-Sluice-User", "bob", "X-Forwarded-Uri", "/v1/chat/completions?x=1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	got := adm.last(t)
	want := frontend.AdmitRequest{Tenant: "acme", APIKeyID: "k1", Model: "gpt-4o", User: "bob", Endpoint: "/v1/chat/completions",
		EstimatePrompt: 1000, EstimateCompletion: 1000, Estimated: true}
	if got != want {
		t.Fatalf("admission asked %+v, want %+v", got, want)
	}
	resp, body = ask(t, hs.URL+"/authz", "X-Sluice-Key-Id", "k1")
	if e := refusedAs(t, resp, body, http.StatusUnauthorized, "missing_tenant"); !strings.Contains(e.Message, "X-Sluice-Tenant") {
		t.Fatalf("%q does not name the header", e.Message)
	}
	resp, body = ask(t, hs.URL+"/authz", "X-Sluice-Tenant", strings.Repeat("t", 65))
	if e := refusedAs(t, resp, body, http.StatusBadRequest, "invalid_header"); !strings.Contains(e.Message, "X-Sluice-Tenant") {
		t.Fatalf("%q does not name the header", e.Message)
	}
}

// TestEnvoyPathAndEstimates: Envoy appends the original path to the
// endpoint's; the estimate headers set what admission debits, bounded.
func TestEnvoyPathAndEstimates(t *testing.T) {
	adm := &fakeAdmitter{}
	hs := newServer(t, DefaultConfig(), Deps{Admitter: adm})
	resp, body := ask(t, hs.URL+"/authz/v1/embeddings", "X-Sluice-Tenant", "acme",
		"X-Sluice-Estimate-Prompt-Tokens", "300", "X-Sluice-Estimate-Completion-Tokens", "0")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if got := adm.last(t); got.Endpoint != "/v1/embeddings" || got.EstimatePrompt != 300 || got.EstimateCompletion != 0 {
		t.Fatalf("admission asked %+v", got)
	}
	for _, v := range []string{"-1", "lots", "10000001"} {
		resp, body := ask(t, hs.URL+"/authz", "X-Sluice-Tenant", "acme", "X-Sluice-Estimate-Completion-Tokens", v)
		if e := refusedAs(t, resp, body, http.StatusBadRequest, "invalid_estimate"); !strings.Contains(e.Message, "X-Sluice-Estimate-Completion-Tokens") || !strings.Contains(e.Message, "10000000") {
			t.Fatalf("estimate %q: %q does not name the header and the limit", v, e.Message)
		}
	}
	if resp, _ := ask(t, hs.URL+"/authzz", "X-Sluice-Tenant", "acme"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a path beside the endpoint's answered %d", resp.StatusCode)
	}
}

// TestRefusalsInOpenAIFormat: the flags' and admission's refusals carry
// the same status, headers and body as sluice gateway's, and the body in
// X-Sluice-Error; admission is not asked about what the flags refused.
func TestRefusalsInOpenAIFormat(t *testing.T) {
	until := time.Now().Add(time.Hour)
	dec := refusingDecider(until, "fraud case 17")
	adm := &fakeAdmitter{}
	hs := newServer(t, DefaultConfig(), Deps{Checker: dec, Admitter: adm, Keys: testKeys(t)})

	resp, body := ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-blocked")
	if refusedAs(t, resp, body, http.StatusForbidden, "blacklisted"); strings.Contains(body, "fraud") || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("blacklist: the operator's reason or a Retry-After leaked: %v %s", resp.Header, body)
	}
	if adm.asked() != 0 {
		t.Fatal("admission was asked about a request the flags refused")
	}
	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-strict")
	if e := refusedAs(t, resp, body, http.StatusServiceUnavailable, "sluice_unavailable"); !strings.Contains(e.Message, "strict") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("fail-closed: %v %q", resp.Header, e.Message)
	}

	hs2 := newServer(t, DefaultConfig(), Deps{Checker: dec})
	resp, body = ask(t, hs2.URL+"/authz", "X-Sluice-Tenant", "spent")
	refusedAs(t, resp, body, http.StatusTooManyRequests, "insufficient_quota")
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-limit-tokens") != "1000" || resp.Header.Get("x-ratelimit-remaining-tokens") != "0" {
		t.Fatalf("quota refusal headers: %v", resp.Header)
	}

	adm.answer(frontend.Admission{
		Limits:  []ratelimit.Limit{{Unit: ratelimit.Requests, Limit: 5, Remaining: 0, Reset: 12 * time.Second}},
		Refused: &frontend.Refusal{Status: http.StatusTooManyRequests, RetryAfter: 12 * time.Second, Error: ratelimit.Error{Type: "requests", Code: "rate_limit_exceeded", Message: "rule per-user (user=jürgen 🚀)"}},
	})
	resp, body = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-trial")
	// Text outside ASCII (a user's name in a rule's scope) travels in the
	// header escaped; refusedAs checks it decodes to the body.
	if e := refusedAs(t, resp, body, http.StatusTooManyRequests, "rate_limit_exceeded"); e.Message != "rule per-user (user=jürgen 🚀)" {
		t.Fatalf("admission message %q", e.Message)
	}
	if resp.Header.Get("Retry-After") != "12" || resp.Header.Get("x-ratelimit-limit-requests") != "5" || resp.Header.Get("x-ratelimit-reset-requests") != "12s" {
		t.Fatalf("admission refusal headers: %v", resp.Header)
	}
	adm.answer(frontend.Admission{Limits: []ratelimit.Limit{{Unit: ratelimit.Tokens, Limit: 9000, Remaining: 7000, Reset: time.Second}}})
	resp, _ = ask(t, hs.URL+"/authz", "Authorization", "Bearer sk-trial")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-ratelimit-remaining-tokens") != "7000" || resp.Header.Get(HeaderError) != "" {
		t.Fatalf("admitted: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestConfigErrorsNameTheSetting(t *testing.T) {
	c := DefaultConfig()
	c.Path = "authz/"
	c.Headers.Model = "X Model"
	c.Headers.User = "x-sluice-tenant"
	c.MaxEstimateTokens = 0
	c.Admission.MaxWait = 0
	err := c.Validate()
	if err == nil {
		t.Fatal("an invalid configuration validated")
	}
	for _, want := range []string{"path: ", "headers.model: ", "headers.user: \"x-sluice-tenant\" is already headers.tenant",
		"max_estimate_tokens: ", "admission.max_wait: "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
}

// TestRefusedChecksEmitRejectedEvents: every check the flags or admission
// refuse (429, 403, 503) is one usage event, outcome rejected, zero
// tokens, the status answered and what refused it — the events sluice
// gateway sends for the requests it refuses (sdk/go/middleware's
// RefusalEvent and AdmissionRefusalEvent), so Sluice counts refusals
// whichever of the two answered. Allowed checks, and checks refused before
// a tenant is known or for a bad header, emit none.
func TestRefusedChecksEmitRejectedEvents(t *testing.T) {
	until := time.Now().Add(time.Hour)
	dec := refusingDecider(until, "")
	adm := &fakeAdmitter{}
	em := &emittertest.Recorder{}
	cfg := DefaultConfig()
	cfg.Name = "edge-authz"
	hs := newServer(t, cfg, Deps{Checker: dec, Admitter: adm, Emitter: em})

	type want struct {
		tenant, model, rule string
		status              int
		refusedBy           string
	}
	check := func(what string, w want) {
		t.Helper()
		evs := em.Take()
		if len(evs) != 1 {
			t.Fatalf("%s: %d events, want 1: %+v", what, len(evs), evs)
		}
		ev := evs[0]
		if ev.Outcome != schemas.OutcomeRejected || ev.Status != w.status || ev.Tenant != w.tenant || ev.Model != w.model ||
			ev.APIKeyID != "k1" || ev.User != "bob" || ev.Endpoint != "/v1/chat/completions" || ev.Gateway != "edge-authz" ||
			ev.PromptTokens != 0 || ev.CompletionTokens != 0 || ev.Attributes["refused_by"] != w.refusedBy || ev.Attributes["rule"] != w.rule {
			t.Fatalf("%s: event %+v, want %+v", what, ev, w)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("%s: the event is not a valid usage event: %v", what, err)
		}
	}
	ask1 := func(tenant string, model string) *http.Response {
		t.Helper()
		resp, _ := ask(t, hs.URL+"/authz", "X-Sluice-Tenant", tenant, "X-Sluice-Key-Id", "k1", "X-Sluice-Model", model,
			"X-Sluice-User", "bob", "X-Forwarded-Uri", "/v1/chat/completions")
		return resp
	}

	if r := ask1("spent", "gpt-4o"); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("spent: %d", r.StatusCode)
	}
	check("a spent quota", want{tenant: "spent", model: "gpt-4o", status: 429, refusedBy: "quota"})
	if r := ask1("blocked", ""); r.StatusCode != http.StatusForbidden {
		t.Fatalf("blocked: %d", r.StatusCode)
	}
	check("a blacklist, no model named", want{tenant: "blocked", model: "unknown", status: 403, refusedBy: "blacklist"})
	if r := ask1("strict", "gpt-4o"); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("strict: %d", r.StatusCode)
	}
	check("a stale view failing closed", want{tenant: "strict", model: "gpt-4o", status: 503, refusedBy: "fail_closed"})

	adm.answer(frontend.Admission{Refused: &frontend.Refusal{Status: http.StatusTooManyRequests, RetryAfter: time.Second, Rule: "per-user",
		Error: ratelimit.Error{Type: "requests", Code: "rate_limit_exceeded", Message: "rule per-user"}}})
	if r := ask1("acme", "gpt-4o"); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("admission: %d", r.StatusCode)
	}
	check("an admission rule", want{tenant: "acme", model: "gpt-4o", status: 429, refusedBy: "admission", rule: "per-user"})
	adm.answer(frontend.Admission{Refused: &frontend.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second,
		Error: ratelimit.Error{Type: "service_unavailable", Code: "admission_unavailable", Message: "fails closed"}}})
	if r := ask1("acme", "gpt-4o"); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("admission unavailable: %d", r.StatusCode)
	}
	check("admission failing closed", want{tenant: "acme", model: "gpt-4o", status: 503, refusedBy: "admission", rule: "fail_closed"})

	adm.answer(frontend.Admission{Refused: &frontend.Refusal{Status: http.StatusBadRequest,
		Error: ratelimit.Error{Type: "invalid_request_error", Code: "admission_refused", Message: "too many rules"}}})
	ask1("acme", "gpt-4o")
	adm.answer(frontend.Admission{})
	ask1("acme", "gpt-4o")
	ask(t, hs.URL+"/authz", "X-Sluice-Key-Id", "k1")
	ask(t, hs.URL+"/authz", "X-Sluice-Tenant", "acme", "X-Sluice-Estimate-Prompt-Tokens", "lots")
	if evs := em.Take(); len(evs) != 0 {
		t.Fatalf("allowed or malformed checks emitted %+v", evs)
	}
}

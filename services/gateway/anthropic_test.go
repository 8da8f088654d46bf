package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/providerusage"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// upstreamAnthropicKey is the provider's credential the tests' gateways
// hold; the mock refuses any other.
const upstreamAnthropicKey = "sk-ant-upstream"

// charges is the mock provider's log of what it billed.
type charges struct {
	mu  sync.Mutex
	all []mockllm.Charge
}

func (c *charges) add(ch mockllm.Charge) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, ch)
}

// runClientScript runs a provider's official Python client script
// against a gateway in front of the mock provider (and a second one whose
// flags refuse the tenant), both made by newGateway, and decodes the JSON
// report the script prints into R. It returns the report, the first
// gateway and what the mock billed through it.
func runClientScript[R any](t *testing.T, py, script string, newGateway func(*testing.T, mockllm.Options, Deps) (*gw, *charges)) (R, *gw, *charges) {
	t.Helper()
	g, bill := newGateway(t, mockllm.Options{ChunkDelay: 10 * time.Millisecond}, Deps{})
	refusingGW, _ := newGateway(t, mockllm.Options{}, Deps{Checker: refusing{}})
	cmd := exec.Command(py, script)
	cmd.Env = append(os.Environ(), "GW_URL="+g.url, "GW_REFUSING_URL="+refusingGW.url, "SLUICE_KEY=sk-acme",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the client script %s failed: %v\n%s\n%s", script, err, stderr.String(), out)
	}
	var res R
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return res, g, bill
}

// wantCutStreamCounted waits for the client scripts' fourth call, the
// stream py-cut that the client cuts after a few chunks, to be billed by
// the mock provider and settled, and checks the settlement: the prompt
// the provider billed, the output the gateway relayed (counted by it, a
// few tokens of the thirty asked for), marked cancelled by the client.
func wantCutStreamCounted(t *testing.T, g *gw, bill *charges) {
	t.Helper()
	itest.Eventually(t, 10*time.Second, "the cut stream's bill and settlement", func() bool {
		n := 0
		for _, ev := range g.sink.Events() {
			if ev.Attributes["request_id"] == "py-cut" && !ev.Estimated {
				n++
			}
		}
		return len(bill.list()) == 4 && n == 1
	})
	ch, ev := bill.list()[3], g.settlement(t, "py-cut")
	if !ch.Cut || ev.PromptTokens != ch.Input || ev.CompletionTokens < 3 || ev.CompletionTokens >= 30 ||
		ev.Attributes["cancelled"] != "client" || ev.Attributes["usage"] != "counted" {
		t.Errorf("cut stream settled %+v; the provider billed %+v", ev, ch)
	}
}

func (c *charges) list() []mockllm.Charge {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]mockllm.Charge(nil), c.all...)
}

// anthropicGateway is a gateway with an Anthropic upstream (the mock, for
// claude-*) beside an OpenAI one (for gpt-*), and the mock's bill.
func anthropicGateway(t *testing.T, opts mockllm.Options, deps Deps) (*gw, *charges) {
	t.Helper()
	bill := &charges{}
	opts.AnthropicKey, opts.Charged = upstreamAnthropicKey, bill.add
	t.Setenv("SLUICE_TEST_ANTHROPIC_KEY", upstreamAnthropicKey)
	tg := testConfig(t,
		Upstream{Name: "anthropic", BaseURL: mock(t, opts), Dialect: policy.DialectAnthropic, APIKeyEnv: "SLUICE_TEST_ANTHROPIC_KEY", Models: []string{"claude-*"}},
		Upstream{Name: "openai", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-*"}})
	return startGateway(t, tg, deps), bill
}

// postAnthropic sends body to path as Anthropic's clients do: the tenant
// key in x-api-key, with anthropic-version.
func postAnthropic(t *testing.T, url, path, key, body string, header ...string) (*http.Response, string) {
	t.Helper()
	return itest.Send(t, http.MethodPost, url+path, body, append([]string{"X-Api-Key", key, "Anthropic-Version", "2023-06-01",
		"Content-Type", "application/json"}, header...)...)
}

// wantCharged checks that the settlement carries the mock's bill token
// type by token type (Anthropic's input leaves the cache out; the event's
// prompt counts all of it).
func wantCharged(t *testing.T, what string, ev schemas.UsageEvent, ch mockllm.Charge) {
	t.Helper()
	if ev.PromptTokens != ch.Input+ch.CacheRead+ch.CacheWrite || ev.CachedTokens != ch.CacheRead ||
		ev.CacheWriteTokens != ch.CacheWrite || ev.CompletionTokens != ch.Output {
		t.Errorf("%s: settled prompt %d (cache read %d, write %d), completion %d; the provider billed input %d, cache read %d, cache write %d, output %d",
			what, ev.PromptTokens, ev.CachedTokens, ev.CacheWriteTokens, ev.CompletionTokens, ch.Input, ch.CacheRead, ch.CacheWrite, ch.Output)
	}
}

// TestAnthropicMessagesMeteredAsBilled: /v1/messages, authenticated by
// the tenant's key in x-api-key, reaches the Anthropic upstream with the
// upstream's own key, and each call — plain, streamed, with the prompt
// cache read and written — is settled with what the provider billed, token
// type by token type; the provider's answer reaches the client unchanged.
func TestAnthropicMessagesMeteredAsBilled(t *testing.T) {
	g, bill := anthropicGateway(t, mockllm.Options{}, Deps{})
	long := strings.Repeat("z", 4*3000)
	for i, tc := range []struct {
		name, body string
		cache      bool
	}{
		{"plain", `{"model":"claude-sonnet-4-5","max_tokens":12,"messages":[{"role":"user","content":"hello there"}]}`, false},
		{"cached", `{"model":"claude-sonnet-4-5","max_tokens":20,"system":[{"type":"text","text":"` + long +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"and now?"}]}`, true},
		{"stream", `{"model":"claude-haiku-4-5","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"stream it"}]}`, false},
		{"stream cached", `{"model":"claude-haiku-4-5","max_tokens":7,"stream":true,"system":[{"type":"text","text":"` + long +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"go"}]}`, true},
	} {
		id := "anth-" + strings.ReplaceAll(tc.name, " ", "-")
		resp, body := postAnthropic(t, g.url, "/v1/messages", "sk-acme", tc.body, "X-Request-Id", id)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		if strings.Contains(tc.name, "stream") != strings.Contains(body, "event: message_delta") {
			t.Errorf("%s: the provider's answer was not relayed as it is: %s", tc.name, body)
		}
		got := bill.list()
		if len(got) != i+1 || got[i].Key != upstreamAnthropicKey {
			t.Fatalf("%s: the provider billed %+v; want one more call, with the upstream's key", tc.name, got)
		}
		ch := got[i]
		if tc.cache != (ch.CacheRead > 0 && ch.CacheWrite > 0) {
			t.Fatalf("%s: the mock billed %+v; the test wants the cache used exactly when the request asks", tc.name, ch)
		}
		ev := g.settlement(t, id)
		wantCharged(t, tc.name, ev, ch)
		if ev.Provider != "anthropic" || ev.Endpoint != "/v1/messages" || ev.Tenant != "acme" || ev.Outcome != schemas.OutcomeOK ||
			ev.Attributes["usage"] != "" || ev.Attributes["upstream_request_id"] != "" && !strings.HasPrefix(ev.Attributes["upstream_request_id"], "req_") {
			t.Errorf("%s: settlement %+v", tc.name, ev)
		}
	}
	var written int64
	for _, ch := range bill.list() {
		written += ch.CacheWrite
	}
	if got := testutil.ToFloat64(g.m.tokens.WithLabelValues("enterprise", "claude-*", "cache_write")); written == 0 || got != float64(written) {
		t.Errorf("sluice_gateway_tokens_total{kind=cache_write} is %v; the provider billed %d cache writes", got, written)
	}
	// count_tokens is passed through and bills nothing.
	before := len(g.sink.Events())
	resp, body := postAnthropic(t, g.url, "/v1/messages/count_tokens", "sk-acme",
		`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hello there"}]}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"input_tokens":`+itoa(mockllm.PromptTokens("hello there"))) {
		t.Errorf("count_tokens: %d %s", resp.StatusCode, body)
	}
	if n := len(g.sink.Events()); n != before {
		t.Errorf("count_tokens emitted %d usage events; it bills nothing", n-before)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestAnthropicRoutesStayInTheirDialect: a Claude model is not served on
// OpenAI's routes nor an OpenAI model on Anthropic's (no upstream of the
// route's dialect serves it), and the gateway's refusals on Anthropic's
// route are Anthropic's error shape.
func TestAnthropicRoutesStayInTheirDialect(t *testing.T) {
	g, bill := anthropicGateway(t, mockllm.Options{}, Deps{})
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Errorf("claude on chat completions: %d %s", resp.StatusCode, body)
	}
	for _, tc := range []struct {
		key, body string
		status    int
		typ       string
	}{
		{"sk-acme", `{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound, "not_found_error"},
		{"sk-nobody", `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, http.StatusUnauthorized, "authentication_error"},
		{"sk-mini-only", `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, http.StatusForbidden, "permission_error"},
		{"sk-acme", `{"model":"claude-sonnet-4-5","model":"x"}`, http.StatusBadRequest, "invalid_request_error"},
	} {
		resp, body := postAnthropic(t, g.url, "/v1/messages", tc.key, tc.body)
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != tc.status || e.Type != "error" ||
			e.Error.Type != tc.typ || e.Error.Message == "" {
			t.Errorf("%s %s: %d %s; want %d with Anthropic's error %s", tc.key, tc.body, resp.StatusCode, body, tc.status, tc.typ)
		}
	}
	if got := bill.list(); len(got) != 0 {
		t.Errorf("the Anthropic upstream billed %+v for calls the gateway refused", got)
	}
}

// anthropicAdmitter refuses every call as over a tokens-per-minute limit,
// and records what it was asked.
type anthropicAdmitter struct {
	mu    sync.Mutex
	asked []frontend.AdmitRequest
}

func (a *anthropicAdmitter) Admit(_ context.Context, req frontend.AdmitRequest) frontend.Admission {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, req)
	return frontend.Admission{Refused: &frontend.Refusal{Status: 429, RetryAfter: 4 * time.Second, Error: ratelimit.Error{Type: ratelimit.TypeTokens,
		Code: ratelimit.CodeRateLimitExceeded, Message: "Tenant acme has reached its acme-tpm limit of 100 tokens per minute."}},
		Limits: []ratelimit.Limit{{Unit: ratelimit.Tokens, Limit: 100, Remaining: 0, Reset: 4 * time.Second}}}
}

// TestAnthropicRefusalsAreAnthropics: a flag's and admission's refusals on
// /v1/messages are 429 with Anthropic's rate_limit_error naming the
// limit, Retry-After and anthropic-ratelimit-* headers (what Anthropic's
// SDKs read to raise RateLimitError), and admission is asked with the
// estimate of the Anthropic request (its prompt, its max_tokens).
func TestAnthropicRefusalsAreAnthropics(t *testing.T) {
	req := `{"model":"claude-sonnet-4-5","max_tokens":321,"system":"be brief","messages":[{"role":"user","content":"what is a token bucket?"}]}`
	g, _ := anthropicGateway(t, mockllm.Options{}, Deps{Checker: refusing{}})
	resp, body := postAnthropic(t, g.url, "/v1/messages", "sk-acme", req)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" ||
		!strings.Contains(body, `"type":"rate_limit_error"`) || !strings.Contains(body, "tokens_per_minute") || strings.Contains(body, `"code"`) {
		t.Errorf("flag refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	adm := &anthropicAdmitter{}
	g2, bill := anthropicGateway(t, mockllm.Options{}, Deps{Limits: &frontend.Limits{Admit: adm}})
	at := time.Now()
	resp, body = postAnthropic(t, g2.url, "/v1/messages", "sk-acme", req, "X-Request-Id", "anth-refused")
	reset, err := time.Parse(time.RFC3339, resp.Header.Get("Anthropic-Ratelimit-Tokens-Reset"))
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "4" || !strings.Contains(body, `"type":"rate_limit_error"`) ||
		!strings.Contains(body, "acme-tpm") || resp.Header.Get("Anthropic-Ratelimit-Tokens-Limit") != "100" ||
		resp.Header.Get("Anthropic-Ratelimit-Tokens-Remaining") != "0" || resp.Header.Get("X-Ratelimit-Limit-Tokens") != "" ||
		err != nil || reset.Before(at.Add(2*time.Second)) || reset.After(at.Add(time.Minute)) {
		t.Errorf("admission refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if len(adm.asked) != 1 || adm.asked[0].EstimatePrompt <= 0 || adm.asked[0].EstimateCompletion != 321 || adm.asked[0].Endpoint != "/v1/messages" {
		t.Errorf("admission asked %+v; want the request's prompt estimated and its max_tokens", adm.asked)
	}
	if ev := g2.settlement(t, "anth-refused"); ev.Outcome != schemas.OutcomeRejected || ev.TotalTokens() != 0 {
		t.Errorf("refusal settled as %+v", ev)
	}
	if got := bill.list(); len(got) != 0 {
		t.Errorf("the provider billed %+v for refused calls", got)
	}
}

// TestAnthropicStreamCutByTheClient: a client that leaves an Anthropic
// stream cuts the provider's call; the settlement has the prompt and its
// cache parts exactly as the provider billed them (message_start carried
// them) and the output relayed until the cut, counted with the gateway's
// tokenizer, an approximation of the provider's (the mock bills a word a
// token; the gateway counts the words it relayed differently), so it is
// held only to at least a token per delta read and less than the whole
// answer.
func TestAnthropicStreamCutByTheClient(t *testing.T) {
	g, bill := anthropicGateway(t, mockllm.Options{ChunkDelay: 20 * time.Millisecond}, Deps{})
	long := strings.Repeat("q", 4*3000)
	ch, ev := cutStream(t, g, bill, "/v1/messages", "event: content_block_delta",
		`{"model":"claude-sonnet-4-5","max_tokens":30,"stream":true,"system":[{"type":"text","text":"`+long+
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"go on"}]}`,
		"X-Request-Id", "anth-cut", "X-Api-Key", "sk-acme", "Anthropic-Version", "2023-06-01", "Authorization", "")
	if !ch.Cut || ch.Output >= 30 {
		t.Fatalf("the mock billed %+v; the test needs a stream cut before its end", ch)
	}
	if ev.PromptTokens != ch.Input+ch.CacheRead+ch.CacheWrite || ev.CachedTokens != ch.CacheRead || ev.CacheWriteTokens != ch.CacheWrite ||
		ev.CompletionTokens < 3 || ev.CompletionTokens >= 30 ||
		ev.Attributes["cancelled"] != "client" || ev.Attributes["usage"] != "counted" || ev.Outcome == schemas.OutcomeError {
		t.Errorf("settlement %+v; the provider billed %+v", ev, ch)
	}
}

// pythonWith returns an interpreter of the test virtualenv
// (sdk/python/requirements-test.txt pins its packages) that has package,
// skipping the test when there is none — failing it under CI=true.
// SLUICE_TEST_PYTHON names another interpreter.
func pythonWith(t *testing.T, pkg string) string {
	t.Helper()
	py := os.Getenv("SLUICE_TEST_PYTHON")
	if py == "" {
		py = filepath.Join(itest.ServicesDir(t), "venv", "bin", "python")
	}
	// find_spec, not an import: importing the clients takes seconds here.
	if err := exec.Command(py, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)", pkg).Run(); err != nil {
		msg := fmt.Sprintf("python with the %s package (%s): %v; run `make pyenv`", pkg, py, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// TestOfficialAnthropicClient: Anthropic's Python client, unchanged,
// against the gateway in front of the mock provider: plain, cached and
// streamed messages work as the client expects and each is settled with
// the usage the client saw, which is what the provider billed, token type
// by token type; a stream the client leaves is settled with the prompt as
// billed and the output relayed, counted; count_tokens answers; a tenant
// the flags refuse raises the client's own RateLimitError naming the limit.
func TestOfficialAnthropicClient(t *testing.T) {
	py := pythonWith(t, "anthropic")
	type report struct {
		Usage       map[string]providerusage.Anthropic `json:"usage"`
		Text        string                             `json:"text"`
		CutDeltas   int                                `json:"cut_deltas"`
		CountTokens int64                              `json:"count_tokens"`
		Refused     *struct {
			Status        int
			Type, Message string
			RetryAfter    string `json:"retry_after"`
		} `json:"refused"`
	}
	res, g, bill := runClientScript[report](t, py, "testdata/anthropic_client.py", anthropicGateway)
	wantSettledAsTheClientSaw(t, g, clientUsages(res.Usage), "py-plain", "py-cached", "py-stream")
	if c := res.Usage["py-cached"]; c.CacheReadInputTokens == 0 || c.CacheCreationInputTokens == 0 {
		t.Errorf("the cached call read or wrote no cache: %+v", c)
	}
	if res.Text == "" || res.CutDeltas != 3 || res.CountTokens != mockllm.PromptTokens("hello there") {
		t.Errorf("client results: %+v", res)
	}
	wantCutStreamCounted(t, g, bill)
	for i, id := range []string{"py-plain", "py-cached", "py-stream"} {
		wantCharged(t, id, g.settlement(t, id), bill.list()[i])
	}
	if r := res.Refused; r == nil || r.Status != 429 || r.Type != "rate_limit_error" || !strings.Contains(r.Message, "tokens_per_minute") || r.RetryAfter != "7" {
		t.Errorf("the refused call raised %+v; want RateLimitError, 429, rate_limit_error naming the limit, retry-after 7", r)
	}
}

package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/providerusage"
)

// upstreamGeminiKey is the provider's credential the tests' gateways
// hold; the mock refuses any other.
const upstreamGeminiKey = "AIza-upstream"

// geminiGateway is a gateway with a Gemini upstream (the mock, for
// gemini-*) beside an OpenAI one (for gpt-*), and the mock's bill.
func geminiGateway(t *testing.T, opts mockllm.Options, deps Deps) (*gw, *charges) {
	t.Helper()
	bill := &charges{}
	opts.GeminiKey, opts.Charged = upstreamGeminiKey, bill.add
	t.Setenv("SLUICE_TEST_GEMINI_KEY", upstreamGeminiKey)
	tg := testConfig(t,
		Upstream{Name: "gemini", BaseURL: strings.TrimSuffix(mock(t, opts), "/v1") + "/v1beta", Dialect: policy.DialectGemini,
			APIKeyEnv: "SLUICE_TEST_GEMINI_KEY", Models: []string{"gemini-*"}},
		Upstream{Name: "openai", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-*"}})
	return startGateway(t, tg, deps), bill
}

// postGemini sends body to path as Google's clients do: the tenant key
// in x-goog-api-key (none when key is empty: the path carries it).
func postGemini(t *testing.T, url, path, key, body string, header ...string) (*http.Response, string) {
	t.Helper()
	h := []string{"Content-Type", "application/json"}
	if key != "" {
		h = append(h, "X-Goog-Api-Key", key)
	}
	return itest.Send(t, http.MethodPost, url+path, body, append(h, header...)...)
}

// wantGeminiCharged checks that the settlement carries the mock's bill
// token type by token type: Gemini's prompt counts its cached content,
// and its thoughts are output, reported as reasoning.
func wantGeminiCharged(t *testing.T, what string, ev schemas.UsageEvent, ch mockllm.Charge) {
	t.Helper()
	if ev.PromptTokens != ch.Input || ev.CachedTokens != ch.CacheRead || ev.CacheWriteTokens != 0 ||
		ev.CompletionTokens != ch.Output+ch.Reasoning || ev.ReasoningTokens != ch.Reasoning {
		t.Errorf("%s: settled prompt %d (cached %d), completion %d (reasoning %d); the provider billed prompt %d, cached %d, candidates %d, thoughts %d",
			what, ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens, ev.ReasoningTokens, ch.Input, ch.CacheRead, ch.Output, ch.Reasoning)
	}
}

// TestGeminiGenerateContentMeteredAsBilled: Gemini's generateContent and
// streamGenerateContent (as Server Sent Events and as its JSON array),
// authenticated by the tenant's key in x-goog-api-key or ?key=, reach
// the Gemini upstream with the upstream's own key, and each call — plain,
// with cached content and thoughts, streamed — is settled with what the
// provider billed, token type by token type; the answer reaches the
// client as the provider sent it.
func TestGeminiGenerateContentMeteredAsBilled(t *testing.T) {
	g, bill := geminiGateway(t, mockllm.Options{}, Deps{})
	for i, tc := range []struct {
		name, path, key, body, starts string
		cached, thinks                bool
	}{
		{"plain", "/v1beta/models/gemini-2.5-flash:generateContent", "sk-acme",
			`{"contents":[{"role":"user","parts":[{"text":"hello there"}]}],"generationConfig":{"maxOutputTokens":12}}`, "{", false, false},
		{"cached thinking", "/v1/models/gemini-2.5-pro:generateContent?key=sk-acme", "",
			`{"cachedContent":"cachedContents/abc","systemInstruction":{"parts":[{"text":"be brief"}]},"contents":[{"role":"user","parts":[{"text":"and now?"}]}],` +
				`"generationConfig":{"maxOutputTokens":20,"thinkingConfig":{"thinkingBudget":128}}}`, "{", true, true},
		{"sse stream", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "sk-acme",
			`{"contents":[{"role":"user","parts":[{"text":"stream it"}]}],"generationConfig":{"maxOutputTokens":9,"thinkingConfig":{"thinkingBudget":64}}}`, "data: ", false, true},
		{"array stream", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", "sk-acme",
			`{"cachedContent":"cachedContents/abc","contents":[{"role":"user","parts":[{"text":"stream it"}]}],"generationConfig":{"maxOutputTokens":7}}`, "[", true, false},
	} {
		id := "gem-" + strings.ReplaceAll(tc.name, " ", "-")
		resp, body := postGemini(t, g.url, tc.path, tc.key, tc.body, "X-Request-Id", id)
		if resp.StatusCode != 200 || !strings.HasPrefix(body, tc.starts) || !strings.Contains(body, `"usageMetadata"`) {
			t.Fatalf("%s: %d %.200s", tc.name, resp.StatusCode, body)
		}
		got := bill.list()
		if len(got) != i+1 || got[i].Key != upstreamGeminiKey {
			t.Fatalf("%s: the provider billed %+v; want one more call, with the upstream's key", tc.name, got)
		}
		ch := got[i]
		if tc.cached != (ch.CacheRead > 0) || tc.thinks != (ch.Reasoning > 0) {
			t.Fatalf("%s: the mock billed %+v; the test wants cached content and thoughts exactly when the request asks", tc.name, ch)
		}
		ev := g.settlement(t, id)
		wantGeminiCharged(t, tc.name, ev, ch)
		if ev.Provider != "gemini" || ev.Model != ch.Model || ev.Tenant != "acme" || ev.Outcome != schemas.OutcomeOK || ev.Attributes["usage"] != "" {
			t.Errorf("%s: settlement %+v", tc.name, ev)
		}
	}
	// One endpoint label for every model and method: the path's model
	// must not multiply the series.
	if got := testutil.ToFloat64(g.m.requests.WithLabelValues("enterprise", "gemini-*", "/v1/models/{model}:generateContent", "200")); got != 4 {
		t.Errorf("sluice_gateway_requests_total for Gemini's endpoint is %v, want 4", got)
	}
}

// TestGeminiRoutesStayInTheirDialect: a Gemini model is not served on
// OpenAI's routes nor an OpenAI model on Gemini's, and the gateway's
// refusals on Gemini's routes are Google's error shape with its status.
func TestGeminiRoutesStayInTheirDialect(t *testing.T) {
	g, bill := geminiGateway(t, mockllm.Options{}, Deps{})
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Errorf("gemini on chat completions: %d %s", resp.StatusCode, body)
	}
	ok := `{"contents":[{"role":"user","parts":[{"text":"x"}]}]}`
	for _, tc := range []struct {
		path, key, body string
		status          int
		googleStatus    string
	}{
		{"/v1beta/models/gpt-4o:generateContent", "sk-acme", ok, http.StatusNotFound, "NOT_FOUND"},
		{"/v1beta/models/gemini-2.5-flash:generateContent", "sk-nobody", ok, http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"/v1beta/models/gemini-2.5-flash:generateContent?key=sk-nobody", "", ok, http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"/v1beta/models/gemini-2.5-flash:generateContent", "sk-mini-only", ok, http.StatusForbidden, "PERMISSION_DENIED"},
		{"/v1beta/models/gemini-2.5-flash:generateContent", "sk-acme", `{"contents":[],"contents":[]}`, http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"/v1beta/models/gemini-2.5-flash:embedContent", "sk-acme", ok, http.StatusNotFound, "NOT_FOUND"},
		{"/v1beta/models/gpt-4o:countTokens", "sk-acme", ok, http.StatusNotFound, "NOT_FOUND"},
	} {
		resp, body := postGemini(t, g.url, tc.path, tc.key, tc.body)
		var e struct {
			Error struct {
				Code            int
				Message, Status string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != tc.status || e.Error.Code != tc.status ||
			e.Error.Status != tc.googleStatus || e.Error.Message == "" {
			t.Errorf("%s %s: %d %s; want %d with Google's error %s", tc.path, tc.key, resp.StatusCode, body, tc.status, tc.googleStatus)
		}
	}
	if got := bill.list(); len(got) != 0 {
		t.Errorf("the Gemini upstream billed %+v for calls the gateway refused", got)
	}
	// countTokens reaches the upstream (with its key) and meters nothing.
	resp, body = postGemini(t, g.url, "/v1/models/gemini-2.5-flash:countTokens", "sk-acme", `{"contents":[{"parts":[{"text":"hello there"}]}]}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"totalTokens":`+itoa(mockllm.PromptTokens("hello there"))) {
		t.Errorf("countTokens: %d %s", resp.StatusCode, body)
	}
	if n := len(g.sink.Events()); n != 0 {
		t.Errorf("countTokens and the refused calls emitted %d usage events", n)
	}
}

// TestGeminiRefusalsAreGoogles: a flag's and admission's refusals on
// Gemini's routes are 429 with Google's RESOURCE_EXHAUSTED error naming
// the limit and Retry-After (what google-genai raises as its ClientError),
// and admission is asked with the estimate of the Gemini request (its
// prompt, its generationConfig.maxOutputTokens).
func TestGeminiRefusalsAreGoogles(t *testing.T) {
	const path = "/v1beta/models/gemini-2.5-flash:generateContent"
	req := `{"systemInstruction":{"parts":[{"text":"be brief"}]},"contents":[{"role":"user","parts":[{"text":"what is a token bucket?"}]}],"generationConfig":{"maxOutputTokens":321}}`
	type googleError struct {
		Error struct {
			Code            int
			Message, Status string
		}
	}
	g, _ := geminiGateway(t, mockllm.Options{}, Deps{Checker: refusing{}})
	resp, body := postGemini(t, g.url, path, "sk-acme", req)
	var e googleError
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" ||
		e.Error.Code != 429 || e.Error.Status != "RESOURCE_EXHAUSTED" || !strings.Contains(e.Error.Message, "tokens_per_minute") {
		t.Errorf("flag refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	adm := &anthropicAdmitter{}
	g2, bill := geminiGateway(t, mockllm.Options{}, Deps{Limits: &frontend.Limits{Admit: adm}})
	resp, body = postGemini(t, g2.url, path, "sk-acme", req, "X-Request-Id", "gem-refused")
	e = googleError{}
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "4" ||
		e.Error.Status != "RESOURCE_EXHAUSTED" || !strings.Contains(e.Error.Message, "acme-tpm") {
		t.Errorf("admission refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if len(adm.asked) != 1 || adm.asked[0].EstimatePrompt <= 0 || adm.asked[0].EstimateCompletion != 321 ||
		adm.asked[0].Model != "gemini-2.5-flash" || adm.asked[0].Endpoint != path {
		t.Errorf("admission asked %+v; want the request's prompt estimated, its maxOutputTokens and the path's model", adm.asked)
	}
	if ev := g2.settlement(t, "gem-refused"); ev.Outcome != schemas.OutcomeRejected || ev.TotalTokens() != 0 || ev.Model != "gemini-2.5-flash" {
		t.Errorf("refusal settled as %+v", ev)
	}
	if got := bill.list(); len(got) != 0 {
		t.Errorf("the provider billed %+v for refused calls", got)
	}
}

// TestGeminiStreamCutByTheClient: a client that leaves a Gemini stream
// cuts the provider's call; the settlement has the prompt, the cached
// content and the thoughts exactly as the provider reported them (every
// event carries the usage so far) and the output relayed until the cut:
// at least the provider's last count, which is a token per event read,
// and less than the whole answer.
func TestGeminiStreamCutByTheClient(t *testing.T) {
	g, bill := geminiGateway(t, mockllm.Options{ChunkDelay: 20 * time.Millisecond}, Deps{})
	ch, ev := cutStream(t, g, bill, "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "data: ",
		`{"cachedContent":"cachedContents/abc","contents":[{"role":"user","parts":[{"text":"go on"}]}],"generationConfig":{"maxOutputTokens":30,"thinkingConfig":{"thinkingBudget":50}}}`,
		"X-Request-Id", "gem-cut", "X-Goog-Api-Key", "sk-acme", "Authorization", "")
	if !ch.Cut || ch.Output >= 30 || ch.CacheRead == 0 || ch.Reasoning != 50 {
		t.Fatalf("the mock billed %+v; the test needs a stream with cached content and thoughts cut before its end", ch)
	}
	if ev.PromptTokens != ch.Input || ev.CachedTokens != ch.CacheRead || ev.ReasoningTokens != ch.Reasoning ||
		ev.CompletionTokens < 3+ch.Reasoning || ev.CompletionTokens >= 30+ch.Reasoning ||
		ev.Attributes["cancelled"] != "client" || ev.Attributes["usage"] != "counted" || ev.Outcome == schemas.OutcomeError {
		t.Errorf("settlement %+v; the provider billed %+v", ev, ch)
	}
}

// TestOfficialGeminiClient: Google's google-genai client, unchanged,
// against the gateway in front of the mock provider: plain, cached and
// thinking, and streamed calls work as the client expects and each is
// settled with the usage the client saw, which is what the provider
// billed, token type by token type; a stream the client leaves is settled
// with the prompt as billed and the output relayed; count_tokens answers
// unmetered; a tenant the flags refuse raises the client's own
// ClientError, code 429, naming the limit.
func TestOfficialGeminiClient(t *testing.T) {
	py := pythonWith(t, "google.genai")
	type report struct {
		Usage       map[string]providerusage.Gemini `json:"usage"`
		Text        string                          `json:"text"`
		CutChunks   int                             `json:"cut_chunks"`
		CountTokens int64                           `json:"count_tokens"`
		Refused     *struct {
			Code        int
			Status      string
			Message     string
			RetryAfter  string `json:"retry_after"`
			ClientError bool   `json:"client_error"`
		} `json:"refused"`
	}
	res, g, bill := runClientScript[report](t, py, "testdata/gemini_client.py", geminiGateway)
	ids := []string{"py-plain", "py-cached", "py-stream"}
	wantSettledAsTheClientSaw(t, g, clientUsages(res.Usage), ids...)
	if c := res.Usage["py-cached"]; c.CachedContentTokenCount == 0 || c.ThoughtsTokenCount == 0 {
		t.Errorf("the cached call read no cache or had no thoughts: %+v", c)
	}
	if res.Text == "" || res.CutChunks != 3 || res.CountTokens != mockllm.PromptTokens("hello there") {
		t.Errorf("client results: %+v", res)
	}
	wantCutStreamCounted(t, g, bill)
	for i, id := range ids {
		wantGeminiCharged(t, id, g.settlement(t, id), bill.list()[i])
	}
	if r := res.Refused; r == nil || !r.ClientError || r.Code != 429 || r.Status != "RESOURCE_EXHAUSTED" ||
		!strings.Contains(r.Message, "tokens_per_minute") || r.RetryAfter != "7" {
		t.Errorf("the refused call raised %+v; want ClientError, 429, RESOURCE_EXHAUSTED naming the limit, retry-after 7", r)
	}
}

// TestGeminiFallsBackWithinItsDialect: when the asked Gemini model's
// upstream fails its breaker opens, and the call falls back to the first
// fallback a Gemini upstream serves — skipping an OpenAI model the policy
// lists before it — called under the fallback model's own URL and
// metered as that model; the OpenAI upstream is never called.
func TestGeminiFallsBackWithinItsDialect(t *testing.T) {
	var dead, openaiCalls atomic.Int64
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		dead.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}`))
	}))
	t.Cleanup(down.Close)
	bill := &charges{}
	t.Setenv("SLUICE_TEST_GEMINI_KEY", upstreamGeminiKey)
	live := strings.TrimSuffix(mock(t, mockllm.Options{GeminiKey: upstreamGeminiKey, Charged: bill.add}), "/v1") + "/v1beta"
	tg := testConfig(t,
		Upstream{Name: "g-dead", BaseURL: down.URL + "/v1beta", Dialect: policy.DialectGemini, APIKeyEnv: "SLUICE_TEST_GEMINI_KEY", Models: []string{"gemini-2.5-pro"}},
		Upstream{Name: "g-live", BaseURL: live, Dialect: policy.DialectGemini, APIKeyEnv: "SLUICE_TEST_GEMINI_KEY", Models: []string{"gemini-2.5-flash"}},
		Upstream{Name: "openai", BaseURL: mock(t, mockllm.Options{Served: func(string, string) { openaiCalls.Add(1) }}), Models: []string{"gpt-*"}})
	tg.policy = `
upstreams:
  g-dead: {breaker: {consecutive_failures: 1, error_ratio: 0, open_for: 1m}}
fallbacks:
  gemini-2.5-pro: [gpt-4o-mini, gemini-2.5-flash]
`
	g := startGateway(t, tg, Deps{})
	const body = `{"contents":[{"role":"user","parts":[{"text":"hello"}]}],"generationConfig":{"maxOutputTokens":5}}`
	resp, out := postGemini(t, g.url, "/v1beta/models/gemini-2.5-pro:generateContent", "sk-acme", body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(out, `"UNAVAILABLE"`) || dead.Load() != 1 {
		t.Fatalf("the only upstream's failure: %d %s after %d calls; want Google's 503 relayed", resp.StatusCode, out, dead.Load())
	}
	resp, out = postGemini(t, g.url, "/v1beta/models/gemini-2.5-pro:generateContent", "sk-acme", body, "X-Request-Id", "gem-fallback")
	if resp.StatusCode != 200 || resp.Header.Get(HeaderServedModel) != "gemini-2.5-flash" || dead.Load() != 1 {
		t.Fatalf("with g-dead's breaker open: %d %v %s (g-dead called %d times); want gemini-2.5-flash on g-live", resp.StatusCode, resp.Header, out, dead.Load())
	}
	got := bill.list()
	if len(got) != 1 || got[0].Model != "gemini-2.5-flash" {
		t.Fatalf("g-live billed %+v; want one call of the fallback model", got)
	}
	ev := g.settlement(t, "gem-fallback")
	wantGeminiCharged(t, "fallback", ev, got[0])
	if ev.Provider != "g-live" || ev.Model != "gemini-2.5-flash" || ev.RequestedModel != "gemini-2.5-pro" {
		t.Errorf("settlement %+v; want provider g-live, the fallback model served for the one asked", ev)
	}
	if n := openaiCalls.Load(); n != 0 {
		t.Errorf("the OpenAI upstream was called %d times for a Gemini request", n)
	}
}

// TestGeminiArrayStreamRelayedAsItComes: Gemini's default stream, a
// JSON array, reaches the client element by element as the provider sends
// it (the client reads three before the answer is over), and a client that
// leaves it cuts the provider's call, settled like an SSE stream: the
// prompt as the provider reported it and the output relayed until the cut.
func TestGeminiArrayStreamRelayedAsItComes(t *testing.T) {
	g, bill := geminiGateway(t, mockllm.Options{ChunkDelay: 20 * time.Millisecond}, Deps{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, rd := openStream(t, ctx, g.url, "/v1/models/gemini-2.5-flash:streamGenerateContent", "",
		`{"contents":[{"role":"user","parts":[{"text":"go on"}]}],"generationConfig":{"maxOutputTokens":20}}`,
		"X-Request-Id", "gem-array-cut", "X-Goog-Api-Key", "sk-acme", "Authorization", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var read strings.Builder
	buf := make([]byte, 512)
	for strings.Count(read.String(), `"responseId"`) < 3 {
		n, err := rd.Read(buf)
		read.Write(buf[:n])
		if err != nil {
			t.Fatalf("%v after %q", err, read.String())
		}
	}
	if !strings.HasPrefix(read.String(), "[{") {
		t.Fatalf("the stream does not begin as Gemini's array: %.80q", read.String())
	}
	cancel()
	resp.Body.Close()
	itest.Eventually(t, 10*time.Second, "the provider's bill and the settlement", func() bool {
		return len(bill.list()) == 1 && len(g.sink.Events()) == 2
	})
	ch, ev := bill.list()[0], g.settlement(t, "gem-array-cut")
	if !ch.Cut || ch.Output >= 20 {
		t.Fatalf("the mock billed %+v; want the stream cut before its end", ch)
	}
	if ev.PromptTokens != ch.Input || ev.CompletionTokens < 3 || ev.CompletionTokens >= 20 ||
		ev.Attributes["cancelled"] != "client" || ev.Attributes["usage"] != "counted" || ev.Outcome == schemas.OutcomeError {
		t.Errorf("settlement %+v; the provider billed %+v", ev, ch)
	}
}

// TestGeminiArrayRelayIsByteForByte: the array relay passes the body on
// unchanged whatever it holds, reads the usage of elements within the
// bound, and leaves an element beyond it — and everything after — unread
// rather than hold it, as the SSE relay does with an outsized event.
func TestGeminiArrayRelayIsByteForByte(t *testing.T) {
	final := `{"candidates":[{"content":{"parts":[{"text":"ok"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":2,"totalTokenCount":9}}`
	big := `{"candidates":[{"content":{"parts":[{"text":"` + strings.Repeat("x", 300) + `"}]}}]}`
	for _, tc := range []struct {
		name, body string
		reported   bool
	}{
		{"small", "[" + final + "]", true},
		{"spaced", " [\r\n" + final + "\r\n,\r\n" + final + "\r\n]\r\n", true},
		{"outsized first", "[" + big + ",\r\n" + final + "]", false},
		{"not an array", final, false},
	} {
		w := httptest.NewRecorder()
		st := &streamState{w: w, rc: http.NewResponseController(w), fam: estimate.Other, max: 200, dialect: policy.DialectGemini}
		// A byte a read, as a slow provider sends: the bound is checked
		// between reads.
		src := &arraySource{r: iotest.OneByteReader(strings.NewReader(tc.body)), st: st}
		err := src.elements()
		src.unbounded = true
		if _, cerr := io.Copy(io.Discard, src); err == nil {
			err = cerr
		}
		if err != nil || w.Body.String() != tc.body || (st.reported != nil) != tc.reported || st.final != tc.reported {
			t.Errorf("%s: err %v, relayed %q, usage %+v (final %v)", tc.name, err, w.Body.String(), st.reported, st.final)
		}
		if tc.reported && (st.reported.PromptTokens != 7 || st.reported.CompletionTokens != 2) {
			t.Errorf("%s: usage %+v", tc.name, st.reported)
		}
	}
}

// TestGeminiTenantKeyNeverReachesTheProvider: whichever way the tenant's
// key came — x-goog-api-key, ?key= or Bearer — the provider sees only the
// upstream's key in x-goog-api-key: no ?key= in its URL (alt=sse alone
// for an SSE stream), no Authorization header.
func TestGeminiTenantKeyNeverReachesTheProvider(t *testing.T) {
	type seen struct{ query, goog, auth string }
	var mu sync.Mutex
	var got []seen
	h := mockllm.New(mockllm.Options{GeminiKey: upstreamGeminiKey})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.URL.RawQuery, r.Header.Get("X-Goog-Api-Key"), r.Header.Get("Authorization")})
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	t.Setenv("SLUICE_TEST_GEMINI_KEY", upstreamGeminiKey)
	g := startGateway(t, testConfig(t, Upstream{Name: "gemini", BaseURL: up.URL + "/v1beta", Dialect: policy.DialectGemini,
		APIKeyEnv: "SLUICE_TEST_GEMINI_KEY", Models: []string{"gemini-*"}}), Deps{})
	const body = `{"contents":[{"role":"user","parts":[{"text":"x"}]}],"generationConfig":{"maxOutputTokens":3}}`
	for _, tc := range []struct {
		path   string
		header []string
		query  string
	}{
		{"/v1/models/gemini-2.5-flash:generateContent", []string{"X-Goog-Api-Key", "sk-acme"}, ""},
		{"/v1/models/gemini-2.5-flash:generateContent?key=sk-acme", nil, ""},
		{"/v1/models/gemini-2.5-flash:streamGenerateContent?key=sk-acme&alt=sse", nil, "alt=sse"},
		{"/v1beta/models/gemini-2.5-flash:generateContent", []string{"Authorization", "Bearer sk-acme"}, ""},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		resp, out := postGemini(t, g.url, tc.path, "", body, tc.header...)
		mu.Lock()
		s := got
		mu.Unlock()
		if resp.StatusCode != 200 || len(s) != 1 || s[0].query != tc.query || s[0].goog != upstreamGeminiKey || s[0].auth != "" {
			t.Errorf("%s %v: %d %.100s; the provider saw %+v", tc.path, tc.header, resp.StatusCode, out, s)
		}
	}
}

package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

func mock(t *testing.T, opts mockllm.Options) string {
	t.Helper()
	up := httptest.NewServer(mockllm.New(opts))
	t.Cleanup(up.Close)
	return up.URL + "/v1"
}

// TestNonStreamedUsageIsExact: every endpoint's settlement carries the
// provider's usage — cached and reasoning tokens included — under the
// request's x-request-id, with the key's tenant, user and id, the
// upstream's name and the estimate sent first under the same id.
func TestNonStreamedUsageIsExact(t *testing.T) {
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{StreamUsage: mockllm.UsageWhenAsked})), Deps{})
	long := strings.Repeat("y", 4*3000)
	for _, tc := range []struct {
		path, body                            string
		prompt, completion, cached, reasoning int64
	}{
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":7,"messages":[{"role":"user","content":"hi there"}]}`,
			mockllm.PromptTokens("hi there"), 7, 0, 0},
		{"/v1/chat/completions", `{"model":"o3-mini","max_completion_tokens":40,"messages":[{"role":"user","content":"` + long + `"}]}`,
			mockllm.PromptTokens(long), 40, mockllm.CachedTokens(mockllm.PromptTokens(long)), 20},
		{"/v1/completions", `{"model":"gpt-3.5-turbo-instruct","max_tokens":9,"prompt":"once upon"}`, 3, 9, 0, 0},
		{"/v1/embeddings", `{"model":"text-embedding-3-small","input":["alpha","beta gamma"]}`, 2 + 3, 0, 0, 0},
		{"/v1/responses", `{"model":"gpt-4o","max_output_tokens":11,"input":"tell me"}`, mockllm.PromptTokens("tell me"), 11, 0, 0},
	} {
		id := fmt.Sprintf("req-%s-%d", strings.ReplaceAll(tc.path, "/", "_"), tc.prompt)
		resp, body := post(t, g.url, tc.path, "sk-acme", tc.body, "X-Request-Id", id)
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id {
			t.Fatalf("%s: %d %s (x-request-id %q)", tc.path, resp.StatusCode, body, resp.Header.Get("X-Request-Id"))
		}
		ev := g.settlement(t, id)
		if ev.PromptTokens != tc.prompt || ev.CompletionTokens != tc.completion || ev.CachedTokens != tc.cached ||
			ev.Tenant != "acme" || ev.User != "batch" || ev.APIKeyID != "acme" || ev.Provider != "mock" || ev.Endpoint != tc.path ||
			ev.Outcome != schemas.OutcomeOK || ev.Status != 200 || ev.Gateway != "gw-test" || ev.Attributes["usage"] != "" {
			t.Errorf("%s: settlement %+v, want %d prompt (%d cached), %d completion", tc.path, ev, tc.prompt, tc.cached, tc.completion)
		}
		if ev.ReasoningTokens != tc.reasoning {
			t.Errorf("%s: reasoning_tokens %d, want %d", tc.path, ev.ReasoningTokens, tc.reasoning)
		}
	}
	var estimates int
	for _, ev := range g.sink.Events() {
		if ev.Estimated {
			estimates++
		}
	}
	if estimates != 5 {
		t.Errorf("%d estimate events, want one per call", estimates)
	}
}

// sseData returns the data payloads of a whole SSE body.
func sseData(body string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestStreamUsageIsAskedForAndStripped: a client that did not ask for
// stream_options.include_usage receives no usage chunk, yet the settlement
// carries the provider's usage (the gateway asked for it); one that asked
// receives it. Chat completions and legacy completions alike; the
// Responses API reports usage in response.completed, which passes.
func TestStreamUsageIsAskedForAndStripped(t *testing.T) {
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{StreamUsage: mockllm.UsageWhenAsked})), Deps{})
	for _, tc := range []struct {
		name, path, body string
		clientSeesUsage  bool
		prompt, compl    int64
	}{
		{"chat", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"stream me"}]}`, false, mockllm.PromptTokens("stream me"), 6},
		{"chat asked", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"messages":[{"role":"user","content":"stream me"}]}`, true, mockllm.PromptTokens("stream me"), 6},
		{"chat other options", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"stream_options":{"include_obfuscation":false},"max_tokens":6,"messages":[{"role":"user","content":"stream me"}]}`, false, mockllm.PromptTokens("stream me"), 6},
		{"completions", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","stream":true,"max_tokens":4,"prompt":"abcdefgh"}`, false, 2, 4},
		{"responses", "/v1/responses", `{"model":"gpt-4o","stream":true,"max_output_tokens":5,"input":"hello"}`, true, mockllm.PromptTokens("hello"), 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "req-" + strings.ReplaceAll(tc.name, " ", "-")
			resp, body := post(t, g.url, tc.path, "sk-acme", tc.body, "X-Request-Id", id)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			sawUsage := strings.Contains(body, `"usage":{`)
			if sawUsage != tc.clientSeesUsage {
				t.Errorf("client saw usage: %v, want %v:\n%s", sawUsage, tc.clientSeesUsage, body)
			}
			data := sseData(body)
			if tc.path != "/v1/responses" && data[len(data)-1] != "[DONE]" {
				t.Errorf("stream does not end with [DONE]: %q", data)
			}
			for _, d := range data[:len(data)-1] {
				if !json.Valid([]byte(d)) {
					t.Errorf("relayed chunk is not JSON: %q", d)
				}
			}
			ev := g.settlement(t, id)
			if ev.PromptTokens != tc.prompt || ev.CompletionTokens != tc.compl || ev.Attributes["usage"] != "" || ev.Outcome != schemas.OutcomeOK {
				t.Errorf("settlement %+v, want %d + %d reported", ev, tc.prompt, tc.compl)
			}
		})
	}
}

// TestStreamIsRelayedChunkByChunk: the client reads the first chunk while
// the upstream still holds the rest: nothing is buffered across events.
func TestStreamIsRelayedChunkByChunk(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	g := startGateway(t, oneUpstream(t, up.URL+"/v1"), Deps{})
	resp, rd := openStream(t, context.Background(), g.url, "/v1/chat/completions", "sk-acme",
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", "chunky")
	defer resp.Body.Close()
	line, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(line, "first") {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	if n := len(g.sink.Events()); n != 1 {
		t.Fatalf("%d events while the stream is open, want the estimate only", n)
	}
	close(release)
	rest := new(strings.Builder)
	_, _ = bufio.NewReader(rd).WriteTo(rest)
	if strings.Contains(rest.String(), "usage") || !strings.Contains(rest.String(), "[DONE]") {
		t.Errorf("rest of the stream %q: the usage chunk the gateway asked for must be removed", rest)
	}
	itest.Eventually(t, 5*time.Second, "settlement", func() bool { return len(g.sink.Events()) == 2 })
	if ev := g.settlement(t, "chunky"); ev.PromptTokens != 3 || ev.CompletionTokens != 1 {
		t.Errorf("settlement %+v", ev)
	}
}

// TestNoUsageIsCounted: a provider that reports no usage is settled with
// tokens the gateway counted (the prompt's count and the generated
// text's), marked usage=counted, streamed or not.
func TestNoUsageIsCounted(t *testing.T) {
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{StreamUsage: mockllm.UsageNever})), Deps{})
	for i, stream := range []bool{false, true} {
		id := fmt.Sprintf("counted-%d", i)
		resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme",
			fmt.Sprintf(`{"model":"gpt-4o","stream":%t,"max_tokens":20,"messages":[{"role":"user","content":"count these words for me please"}]}`, stream), "X-Request-Id", id)
		if resp.StatusCode != 200 || strings.Contains(body, `"usage":{`) {
			t.Fatalf("stream %v: %d %s", stream, resp.StatusCode, body)
		}
		ev := g.settlement(t, id)
		// The mock answers "ok " 20 times: about 20 tokens; the prompt is
		// counted from the body (about 6 words plus the chat overhead).
		if ev.Attributes["usage"] != "counted" || ev.CompletionTokens < 10 || ev.CompletionTokens > 45 || ev.PromptTokens < 8 || ev.PromptTokens > 20 {
			t.Errorf("stream %v: settlement %+v, want counted tokens near 20 + 12", stream, ev)
		}
	}
}

// TestClientLeavingMidStreamCancelsAndSettles: a client that hangs up
// cancels the upstream call, and the call is settled once, with what was
// generated until then, marked cancelled=client.
func TestClientLeavingMidStreamCancelsAndSettles(t *testing.T) {
	cancelled := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"generated words here \"}}]}\n\n")
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes: the gateway must cancel
		close(cancelled)
	}))
	defer up.Close()
	g := startGateway(t, oneUpstream(t, up.URL+"/v1"), Deps{})
	ctx, cancel := context.WithCancel(context.Background())
	resp, rd := openStream(t, ctx, g.url, "/v1/chat/completions", "sk-acme",
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", "gone")
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream call was not cancelled when the client left")
	}
	itest.Eventually(t, 5*time.Second, "settlement", func() bool { return len(g.sink.Events()) == 2 })
	ev := g.settlement(t, "gone")
	if ev.Attributes["cancelled"] != "client" || ev.Attributes["usage"] != "counted" || ev.CompletionTokens < 6 || ev.PromptTokens == 0 ||
		ev.Outcome == schemas.OutcomeError {
		t.Errorf("settlement %+v: want what was generated, counted, cancelled=client, not an error", ev)
	}
}

// TestUpstreamErrorsAndTimeouts: a provider's 5xx and a provider that
// does not answer in time are settled at zero tokens with outcome error
// and timeout, their status and latency, for the breakers.
func TestUpstreamErrorsAndTimeouts(t *testing.T) {
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"boom","type":"server_error"}}`)
	}))
	defer failing.Close()
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hang) // before Close, which waits for the handler
	cfg := testConfig(t,
		Upstream{Name: "failing", BaseURL: failing.URL + "/v1", Models: []string{"bad-model"}},
		Upstream{Name: "slow", BaseURL: slow.URL + "/v1", Models: []string{"slow-model"}, ResponseHeaderTimeout: 200 * time.Millisecond, Timeout: time.Minute})
	g := startGateway(t, cfg, Deps{})
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"bad-model","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "e500")
	if resp.StatusCode != 500 || !strings.Contains(body, "boom") {
		t.Errorf("upstream 500 relayed as %d %s", resp.StatusCode, body)
	}
	if ev := g.settlement(t, "e500"); ev.Outcome != schemas.OutcomeError || ev.Status != 500 || ev.TotalTokens() != 0 || ev.Provider != "failing" {
		t.Errorf("500 settlement %+v", ev)
	}
	start := time.Now()
	resp, body = post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"slow-model","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "t504")
	if resp.StatusCode != 504 || !strings.Contains(body, `"code":"upstream_timeout"`) {
		t.Errorf("timeout answered %d %s", resp.StatusCode, body)
	}
	ev := g.settlement(t, "t504")
	if ev.Outcome != schemas.OutcomeTimeout || ev.Status != 504 || ev.LatencyMS < 200 || ev.LatencyMS > time.Since(start).Milliseconds() {
		t.Errorf("timeout settlement %+v, want outcome timeout, 504, latency at least the 200ms header timeout", ev)
	}
}

// TestFailoverAndBalance: when one upstream of a model fails, the request
// is served by another (attempts=2 on the event); among healthy upstreams
// requests spread by weight.
func TestFailoverAndBalance(t *testing.T) {
	var down, a, b atomic.Int64
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		down.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer dead.Close()
	counting := func(n *atomic.Int64) string {
		h := mockllm.Handler()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1); h.ServeHTTP(w, r) }))
		t.Cleanup(srv.Close)
		return srv.URL + "/v1"
	}
	cfg := testConfig(t,
		Upstream{Name: "dead", BaseURL: dead.URL + "/v1", Models: []string{"gpt-4o"}},
		Upstream{Name: "live", BaseURL: counting(&a), Models: []string{"gpt-4o"}},
		Upstream{Name: "light", BaseURL: counting(&b), Models: []string{"gpt-4o-mini"}, Weight: 1},
		Upstream{Name: "heavy", BaseURL: counting(&a), Models: []string{"gpt-4o-mini"}, Weight: 3})
	g := startGateway(t, cfg, Deps{})
	for i := range 20 {
		resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", fmt.Sprint("fo-", i))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s despite a live upstream", i, resp.StatusCode, body)
		}
	}
	if down.Load() == 0 || down.Load() > 10 {
		t.Errorf("the dead upstream got %d of 20 requests: want some (it is tried) but few (its breaker opens and it is tried last)", down.Load())
	}
	sawAttempts := false
	for _, ev := range g.sink.Events() {
		if !ev.Estimated && ev.Attributes["attempts"] == "2" && ev.Provider == "live" {
			sawAttempts = true
		}
	}
	if !sawAttempts {
		t.Error("no settlement says it took two attempts")
	}
	a.Store(0)
	for i := range 400 {
		post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", fmt.Sprint("w-", i))
	}
	// Weights 1:3 of 400: 100 and 300 expected; the bounds are ten
	// standard deviations wide.
	if b.Load() < 15 || b.Load() > 185 || a.Load()+b.Load() != 400 {
		t.Errorf("weights 1:3 split 400 requests %d:%d", b.Load(), a.Load())
	}
}

// TestKeysModelsAndPriority: callers authenticate with their tenant key;
// a model the key may not use, an unknown model and a priority the key
// may not set are refused in OpenAI's error shape, and /v1/models lists
// what the key may use.
func TestKeysModelsAndPriority(t *testing.T) {
	cfg := testConfig(t, Upstream{Name: "mock", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o", "gpt-4o-mini", "text-embedding-3-small", "gpt-4.1*"}})
	g := startGateway(t, cfg, Deps{})
	chat := `{"model":"%s","messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		key, model string
		header     []string
		status     int
		code       string
	}{
		{"sk-nobody", "gpt-4o", nil, 401, "invalid_api_key"},
		{"sk-mini-only", "gpt-4o", nil, 403, "model_not_allowed"},
		{"sk-mini-only", "gpt-4o-mini", nil, 200, ""},
		{"sk-acme", "claude-3", nil, 404, "model_not_found"},
		{"sk-acme", "gpt-4.1-nano", nil, 200, ""},
		{"sk-acme", "gpt-4o", []string{"X-Sluice-Priority", "critical"}, 403, "priority_not_allowed"},
		// Any caller may lower its own priority.
		{"sk-acme", "gpt-4o", []string{"X-Sluice-Priority", "low", "X-Request-Id", "lowered"}, 200, ""},
		{"sk-boss", "gpt-4o", []string{"X-Sluice-Priority", "urgent"}, 400, "invalid_priority"},
		{"sk-boss", "gpt-4o", []string{"X-Sluice-Priority", "critical", "X-Request-Id", "prio"}, 200, ""},
	} {
		resp, body := post(t, g.url, "/v1/chat/completions", tc.key, fmt.Sprintf(chat, tc.model), tc.header...)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.key, tc.model, resp.StatusCode, body, tc.status)
			continue
		}
		if tc.code != "" {
			var e ratelimit.Body
			if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Errorf("%s %s: body %s, want OpenAI's error shape with code %s", tc.key, tc.model, body, tc.code)
			}
		}
	}
	if ev := g.settlement(t, "prio"); ev.Priority != schemas.PriorityCritical {
		t.Errorf("priority not carried: %+v", ev)
	}
	if ev := g.settlement(t, "lowered"); ev.Priority != schemas.PriorityLow {
		t.Errorf("lowered priority not carried: %+v", ev)
	}
	req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-mini-only")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "gpt-4o-mini,text-embedding-3-small" {
		t.Errorf("/v1/models for mini-only lists %v", ids)
	}
}

// TestEventIDsAreTheGatewaysNotTheClients: Sluice deduplicates events,
// and admission marks settlements, by event id, so an id a client chose
// would let a second call under it — the same client again, another
// tenant, the same client at another gateway — go unmetered. Every call
// gets an id the gateway makes; the client's x-request-id is answered back
// and kept as attribute request_id.
func TestEventIDsAreTheGatewaysNotTheClients(t *testing.T) {
	up := oneUpstream(t, mock(t, mockllm.Options{}))
	a, b := startGateway(t, up, Deps{}), startGateway(t, up, Deps{})
	for _, call := range []struct{ url, key string }{{a.url, "sk-acme"}, {a.url, "sk-acme"}, {a.url, "sk-mini-only"}, {b.url, "sk-acme"}} {
		resp, body := post(t, call.url, "/v1/chat/completions", call.key, `{"model":"gpt-4o-mini","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "same")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Request-Id") != "same" {
			t.Fatalf("%s: %d %s, x-request-id %q", call.key, resp.StatusCode, body, resp.Header.Get("X-Request-Id"))
		}
	}
	ids := map[string]bool{}
	for _, ev := range append(a.sink.Events(), b.sink.Events()...) {
		if ev.Estimated {
			continue
		}
		if ev.ID == "same" || ids[ev.ID] || ev.Attributes["request_id"] != "same" || ev.CompletionTokens != 3 {
			t.Fatalf("settlement %+v: want a fresh gateway id (seen: %v) and request_id=same", ev, ids)
		}
		ids[ev.ID] = true
	}
	if len(ids) != 4 {
		t.Fatalf("%d settlements, want 4", len(ids))
	}
}

// refusing is a Decider with one flag on tenant acme.
type refusing struct{}

func (refusing) Check(tenant, model, key string) checker.Decision {
	if tenant != "acme" {
		return checker.Decision{}
	}
	return checker.Decision{Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate,
		Quota: "tokens_per_minute", Period: "minute", Limit: 1000, Used: 1200, RetryAfter: 7 * time.Second}}
}

// admitter records what it was asked and refuses tenant trial.
type admitter struct {
	mu      sync.Mutex
	asked   []frontend.AdmitRequest
	settled []frontend.Settlement
}

func (a *admitter) Admit(_ context.Context, req frontend.AdmitRequest) frontend.Admission {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, req)
	if req.Tenant == "trial" {
		return frontend.Admission{Refused: &frontend.Refusal{Status: 429, RetryAfter: 3 * time.Second, Error: ratelimit.Error{Type: ratelimit.TypeTokens,
			Code: ratelimit.CodeRateLimitExceeded, Message: "Tenant trial has reached its tokens per minute limit."}},
			Limits: []ratelimit.Limit{{Unit: ratelimit.Tokens, Limit: 100, Remaining: 0, Reset: 3 * time.Second}}}
	}
	return frontend.Admission{Settle: func(s frontend.Settlement) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.settled = append(a.settled, s)
	}}
}

// TestFlagsAndAdmission: the Checker's refusal reaches the client as
// OpenAI's 429 naming the limit with Retry-After; the Admitter is asked
// with the tenant, model, key, endpoint, priority and estimate before the
// upstream call, its refusal is answered as it says and settled as
// rejected, and an admitted call is settled with its usage once.
func TestFlagsAndAdmission(t *testing.T) {
	adm := &admitter{}
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{})), Deps{Checker: refusing{}, Limits: &frontend.Limits{Admit: adm}})
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" || !strings.Contains(body, "tokens_per_minute") {
		t.Errorf("flag refusal: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	resp, body = post(t, g.url, "/v1/chat/completions", "sk-mini-only", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "adm-refused")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" || resp.Header.Get("X-Ratelimit-Remaining-Tokens") != "0" ||
		!strings.Contains(body, "tokens per minute") {
		t.Errorf("admission refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if ev := g.settlement(t, "adm-refused"); ev.Outcome != schemas.OutcomeRejected || ev.TotalTokens() != 0 || ev.Attributes["refused_by"] != "admission" {
		t.Errorf("admission refusal settled as %+v", ev)
	}
	g2 := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{})), Deps{Limits: &frontend.Limits{Admit: adm}})
	resp, body = post(t, g2.url, "/v1/chat/completions", "sk-boss", `{"model":"gpt-4o","max_tokens":9,"messages":[{"role":"user","content":"x"}]}`,
		"X-Request-Id", "adm-ok", "X-Sluice-Priority", "low")
	if resp.StatusCode != 200 {
		t.Fatalf("admitted call: %d %s", resp.StatusCode, body)
	}
	adm.mu.Lock()
	defer adm.mu.Unlock()
	last := adm.asked[len(adm.asked)-1]
	if last.Tenant != "acme" || last.Model != "gpt-4o" || last.APIKeyID != "boss" || last.Endpoint != "/v1/chat/completions" ||
		last.Priority != schemas.PriorityLow || !last.Estimated || last.EstimateCompletion != 9 || last.EstimatePrompt == 0 || last.EventID != g2.settlement(t, "adm-ok").ID {
		t.Errorf("admission asked %+v", last)
	}
	if len(adm.settled) != 1 || adm.settled[0].Usage.CompletionTokens != 9 || adm.settled[0].Outcome != schemas.OutcomeOK || adm.settled[0].Status != 200 {
		t.Errorf("admission settled %+v, want once with the call's usage", adm.settled)
	}
}

// TestShutdownFinishesThenCutsAndSettles: at shutdown a stream that ends
// within shutdown_timeout is relayed to its end; one that does not is cut
// when the time is over, its upstream call cancelled, and settled with
// what it generated — before shutdown returns, so the Emitter, closed
// next, still sends it.
func TestShutdownFinishesThenCutsAndSettles(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"some words were generated\"}}]}\n\n")
		w.(http.Flusher).Flush()
		if strings.Contains(r.Header.Get("X-Request-Id"), "forever") {
			<-r.Context().Done()
			return
		}
		<-release
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	cfg := oneUpstream(t, up.URL+"/v1")
	g := startGateway(t, cfg, Deps{})
	srv := httptest.NewUnstartedServer(g.Server)
	srv.Start()
	defer srv.Close()
	var wg sync.WaitGroup
	bodies := map[string]*strings.Builder{"finishes": {}, "forever": {}}
	for id, b := range bodies {
		resp, rd := openStream(t, context.Background(), srv.URL, "/v1/chat/completions", "sk-acme",
			`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", id)
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); defer resp.Body.Close(); _, _ = rd.WriteTo(b) }()
	}
	done := make(chan error, 1)
	go func() { done <- g.shutdown(srv.Config, 2*time.Second) }()
	close(release) // the first stream ends during the drain
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("shutdown did not return")
	}
	if ev := g.settlement(t, "finishes"); ev.PromptTokens != 4 || ev.CompletionTokens != 5 || ev.Outcome != schemas.OutcomeOK {
		t.Errorf("stream that ended during the drain settled as %+v", ev)
	}
	if ev := g.settlement(t, "forever"); ev.Attributes["cancelled"] != "shutdown" || ev.CompletionTokens == 0 || ev.Outcome == schemas.OutcomeError {
		t.Errorf("stream cut at the end of the drain settled as %+v: want what it generated, cancelled=shutdown, not an error", ev)
	}
	wg.Wait()
	if !strings.Contains(bodies["finishes"].String(), "[DONE]") {
		t.Errorf("the stream that ended during the drain was cut: %q", bodies["finishes"])
	}
}

// TestClientLeavingAPlainCallIsMeteredWithTheProvidersUsage: a client
// that disconnects from a non-streamed call — before the provider
// answers, or while its answer is read — cannot make the call unmetered:
// the gateway reads the provider's answer to its end and settles the
// provider's usage, and the call ends as cut by its client (outcome empty,
// cancelled=client), not as the provider's failure.
func TestClientLeavingAPlainCallIsMeteredWithTheProvidersUsage(t *testing.T) {
	for _, when := range []string{"before the answer", "during the answer"} {
		t.Run(when, func(t *testing.T) {
			release, upstreamCut := make(chan struct{}), make(chan struct{}, 1)
			received := make(chan struct{}, 1)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				received <- struct{}{}
				const answer = `{"id":"x","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"done"}}],"usage":{"prompt_tokens":1234,"completion_tokens":567,"total_tokens":1801}}`
				if when == "during the answer" {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(answer[:20]))
					w.(http.Flusher).Flush()
				}
				select {
				case <-release:
				case <-r.Context().Done():
					upstreamCut <- struct{}{} // the gateway gave the call up
					return
				}
				if when == "during the answer" {
					_, _ = w.Write([]byte(answer[20:]))
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(answer))
			}))
			defer up.Close()
			tg := oneUpstream(t, up.URL+"/v1")
			p := tg.parsePolicy(t)
			keys, err := frontend.OpenKeys(writeKeys(t), slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			sink := &emittertest.Recorder{}
			guards := NewGuards(nil, "", "test", nil, nil)
			t.Cleanup(guards.Close)
			if err := guards.Update(p); err != nil {
				t.Fatal(err)
			}
			srv, err := NewServer(tg.Config, Deps{Emitter: sink, Keys: keys, Policy: func() *policy.Policy { return p }, Guards: guards, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			clientGone := make(chan struct{})
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				go func() { <-r.Context().Done(); close(clientGone) }()
				srv.ServeHTTP(w, r)
			}))
			defer hs.Close()

			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer sk-acme")
			req.Header.Set("X-Request-Id", "left")
			go func() {
				<-received
				cancel() // the client hangs up
			}()
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			<-clientGone // the gateway has seen the client leave
			close(release)
			select {
			case <-upstreamCut:
				t.Fatal("the gateway cut the provider's call when the client left: its usage is lost")
			default:
			}
			itest.Eventually(t, 10*time.Second, "settlement", func() bool { return len(sink.Events()) == 2 })
			var ev schemas.UsageEvent
			for _, e := range sink.Events() {
				if !e.Estimated {
					ev = e
				}
			}
			if ev.PromptTokens != 1234 || ev.CompletionTokens != 567 || ev.Attributes["cancelled"] != "client" || ev.Outcome == schemas.OutcomeError {
				t.Errorf("settlement %+v: want the provider's 1234+567 tokens, cancelled=client, not an error", ev)
			}
		})
	}
}

// TestModelsListsWhatPatternUpstreamsServe: under `models: ["*"]` (the
// README's configuration) or a pattern such as text-embedding-3-*,
// GET /v1/models lists the models the upstream itself lists that its
// patterns match and the key may use — not nothing — asking the upstream
// at most once per catalogTTL.
func TestModelsListsWhatPatternUpstreamsServe(t *testing.T) {
	var asked atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer up-key" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"gpt-4o"},{"id":"gpt-4o-mini"},{"id":"text-embedding-3-large"},{"id":"dall-e-3"}]}`)
	}))
	defer up.Close()
	t.Setenv("SLUICE_TEST_UP_KEY", "up-key")
	cfg := testConfig(t,
		Upstream{Name: "chat", BaseURL: up.URL + "/v1", Models: []string{"gpt-*"}},
		Upstream{Name: "embed", BaseURL: up.URL + "/v1", Models: []string{"text-embedding-3-*"}})
	cfg.policy = "upstreams:\n  chat: {api_key_env: SLUICE_TEST_UP_KEY}\n  embed: {api_key_env: SLUICE_TEST_UP_KEY}\n"
	g := startGateway(t, cfg, Deps{})
	list := func(key string) string {
		req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct {
			Data []struct{ ID string } `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range l.Data {
			ids = append(ids, m.ID)
		}
		return strings.Join(ids, ",")
	}
	if got := list("sk-acme"); got != "gpt-4o,gpt-4o-mini,text-embedding-3-large" {
		t.Errorf("acme's /v1/models: %s", got)
	}
	if got := list("sk-mini-only"); got != "gpt-4o-mini,text-embedding-3-small" {
		t.Errorf("mini-only's /v1/models: %s", got)
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("the upstreams were asked %d times for two lists of two upstreams each, want 2 (cached)", n)
	}
}

package gateway

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
)

// TestAzureUpstreamServesOpenAIRoutes: an upstream of dialect azure
// serves OpenAI's routes at Azure OpenAI's deployment URLs — the model's
// deployment from the policy, else the deployment named as the model,
// with the upstream's api-version and its key in api-key — and each call
// is metered with the usage Azure answers, reasoning tokens included.
func TestAzureUpstreamServesOpenAIRoutes(t *testing.T) {
	var mu sync.Mutex
	var served []string
	base := mock(t, mockllm.Options{AzureKey: "azure-upstream-key", Served: func(endpoint, _ string) {
		mu.Lock()
		defer mu.Unlock()
		served = append(served, endpoint)
	}})
	t.Setenv("SLUICE_TEST_AZURE_KEY", "azure-upstream-key")
	tg := testConfig(t, Upstream{Name: "azure", BaseURL: strings.TrimSuffix(base, "/v1") + "/openai", Models: []string{"gpt-4o", "o3-mini", "text-embedding-3-small"}})
	tg.policy = `
upstreams:
  azure: {dialect: azure, api_key_env: SLUICE_TEST_AZURE_KEY, deployments: {gpt-4o: prod-4o}}
`
	g := startGateway(t, tg, Deps{})
	for _, tc := range []struct {
		path, body, deployment    string
		prompt, completion, reaso int64
	}{
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":7,"messages":[{"role":"user","content":"hi there"}]}`,
			"/openai/deployments/prod-4o/chat/completions", mockllm.PromptTokens("hi there"), 7, 0},
		{"/v1/chat/completions", `{"model":"o3-mini","max_completion_tokens":40,"messages":[{"role":"user","content":"think"}]}`,
			"/openai/deployments/o3-mini/chat/completions", mockllm.PromptTokens("think"), 40, 20},
		{"/v1/embeddings", `{"model":"text-embedding-3-small","input":["alpha","beta gamma"]}`,
			"/openai/deployments/text-embedding-3-small/embeddings", 2 + 3, 0, 0},
	} {
		id := "az-" + strings.ReplaceAll(tc.deployment, "/", "_")
		resp, body := post(t, g.url, tc.path, "sk-acme", tc.body, "X-Request-Id", id)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tc.deployment, resp.StatusCode, body)
		}
		mu.Lock()
		last := served[len(served)-1]
		mu.Unlock()
		if last != tc.deployment {
			t.Errorf("Azure served %s, want %s", last, tc.deployment)
		}
		ev := g.settlement(t, id)
		if ev.PromptTokens != tc.prompt || ev.CompletionTokens != tc.completion || ev.ReasoningTokens != tc.reaso || ev.Provider != "azure" {
			t.Errorf("%s: settlement %+v, want %d prompt, %d completion (%d reasoning)", tc.deployment, ev, tc.prompt, tc.completion, tc.reaso)
		}
	}
}

// TestAzureClientURLs: Azure OpenAI's clients reach the gateway at
// deployment URLs with their key in api-key; the deployment is the model
// routed, authorised and metered (whatever model the body names, as Azure
// serves the deployment), and the upstream is asked for it.
func TestAzureClientURLs(t *testing.T) {
	var mu sync.Mutex
	var served []string
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{Served: func(endpoint, model string) {
		mu.Lock()
		defer mu.Unlock()
		served = append(served, endpoint+" "+model)
	}})), Deps{})
	azure := func(key, deployment, body, id string) (int, string) {
		resp, b := itest.Send(t, http.MethodPost, g.url+"/openai/deployments/"+deployment+"/chat/completions?api-version=2024-10-21", body,
			"Api-Key", key, "Content-Type", "application/json", "X-Request-Id", id)
		return resp.StatusCode, b
	}
	for _, tc := range []struct{ id, body string }{
		{"az-nomodel", `{"max_tokens":5,"messages":[{"role":"user","content":"hi there"}]}`},
		{"az-othermodel", `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi there"}]}`},
	} {
		if code, b := azure("sk-acme", "gpt-4o", tc.body, tc.id); code != 200 {
			t.Fatalf("%s: %d %s", tc.id, code, b)
		}
		mu.Lock()
		last := served[len(served)-1]
		mu.Unlock()
		if last != "/v1/chat/completions gpt-4o" {
			t.Errorf("%s: the upstream served %q, want the deployment's model gpt-4o", tc.id, last)
		}
		if ev := g.settlement(t, tc.id); ev.Model != "gpt-4o" || ev.PromptTokens != mockllm.PromptTokens("hi there") || ev.CompletionTokens != 5 {
			t.Errorf("%s: settlement %+v", tc.id, ev)
		}
	}
	if code, b := azure("sk-mini-only", "gpt-4o", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}`, "az-denied"); code != http.StatusForbidden {
		t.Errorf("a key without gpt-4o, asking for the gpt-4o deployment: %d %s; want 403", code, b)
	}
}

// TestOfficialOpenAIClientAzureMode: the openai Python client's Azure mode
// (AzureOpenAI), unchanged, against the gateway: chat plain and streamed
// and embeddings at deployment URLs with the key in api-key, each settled
// with the usage the client saw; a tenant the flags refuse raises the
// client's RateLimitError naming the limit, with Retry-After.
func TestOfficialOpenAIClientAzureMode(t *testing.T) {
	py := pythonWith(t, "openai")
	type report struct {
		Usage   map[string][2]int64 `json:"usage"`
		Refused *struct {
			Status     int    `json:"status"`
			Message    string `json:"message"`
			RetryAfter string `json:"retry_after"`
		} `json:"refused"`
	}
	res, g, _ := runClientScript[report](t, py, "testdata/azure_client.py", func(t *testing.T, o mockllm.Options, d Deps) (*gw, *charges) {
		o.StreamUsage = mockllm.UsageWhenAsked
		return startGateway(t, oneUpstream(t, mock(t, o)), d), nil
	})
	if len(res.Usage) != 3 {
		t.Fatalf("the client saw usage for %d calls, want 3: %+v", len(res.Usage), res)
	}
	for id, u := range res.Usage {
		if ev := g.settlement(t, id); ev.PromptTokens != u[0] || ev.CompletionTokens != u[1] || ev.Attributes["usage"] != "" {
			t.Errorf("%s: settled %+v; the client saw %v", id, ev, u)
		}
	}
	if r := res.Refused; r == nil || r.Status != 429 || !strings.Contains(r.Message, "tokens_per_minute") || r.RetryAfter != "7" {
		t.Errorf("the refused call raised %+v; want RateLimitError, 429 naming the limit, Retry-After 7", r)
	}
}

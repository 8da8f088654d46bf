package mockllm

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestUsageInPlainAndStreamingResponses(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	want := Usage{PromptTokens: PromptTokens("hello there"), CompletionTokens: 10}
	want.TotalTokens = want.PromptTokens + want.CompletionTokens
	for _, stream := range []string{"false", "true"} {
		resp, body := post(t, srv.URL, `{"model":"gpt-4o","max_tokens":10,"stream":`+stream+`,"messages":[{"role":"user","content":"hello there"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%s: status %d %s", stream, resp.StatusCode, body)
		}
		got, ok := ParseUsage(resp.Header.Get("Content-Type"), body)
		if !ok || got != want {
			t.Fatalf("stream=%s: usage %+v ok=%v, want %+v", stream, got, ok, want)
		}
	}
}

func TestBadRequestIsOpenAIError(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	resp, body := post(t, srv.URL, `{"model":""}`)
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"message":"model and messages are required"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
}

func postTo(t *testing.T, url, path, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestStreamUsageModes: as OpenAI, a stream carries usage only when asked
// (UsageWhenAsked), with "usage": null on the other chunks; UsageNever
// reports none anywhere.
func TestStreamUsageModes(t *testing.T) {
	asked := httptest.NewServer(New(Options{StreamUsage: UsageWhenAsked}))
	defer asked.Close()
	never := httptest.NewServer(New(Options{StreamUsage: UsageNever}))
	defer never.Close()
	const stream = `{"model":"gpt-4o","max_tokens":3,"stream":true,%s"messages":[{"role":"user","content":"hi"}]}`
	_, plain := postTo(t, asked.URL, "/v1/chat/completions", strings.Replace(stream, "%s", "", 1))
	if strings.Contains(plain, `"usage"`) {
		t.Errorf("usage in a stream that did not ask for it:\n%s", plain)
	}
	_, withUsage := postTo(t, asked.URL, "/v1/chat/completions", strings.Replace(stream, "%s", `"stream_options":{"include_usage":true},`, 1))
	if u, ok := ParseUsage("text/event-stream", []byte(withUsage)); !ok || u.CompletionTokens != 3 || !strings.Contains(withUsage, `"usage":null`) {
		t.Errorf("asked stream: usage %+v %v in\n%s", u, ok, withUsage)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/completions"} {
		_, b := postTo(t, never.URL, path, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"input":"hi","prompt":"hi","stream_options":{"include_usage":true}}`)
		if strings.Contains(b, `"usage":{`) {
			t.Errorf("%s: usage from a mock that reports none: %s", path, b)
		}
	}
}

// TestToolsEmbeddingsResponsesAndDetails: a tool call answers a user turn
// with tools; embeddings come as floats or base64; the Responses API
// reports its own usage shape; long prompts report cached tokens and
// o-series models reasoning tokens.
func TestToolsEmbeddingsResponsesAndDetails(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	_, b := postTo(t, srv.URL, "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]}`)
	if !strings.Contains(b, `"finish_reason":"tool_calls"`) || !strings.Contains(b, `"name":"get_weather"`) {
		t.Errorf("no tool call: %s", b)
	}
	_, b = postTo(t, srv.URL, "/v1/embeddings", `{"model":"text-embedding-3-small","input":["a","b"],"encoding_format":"base64"}`)
	if !strings.Contains(b, `"embedding":"AACAPw`) || !strings.Contains(b, `"prompt_tokens":2`) {
		t.Errorf("base64 embeddings: %s", b)
	}
	long := strings.Repeat("x", 4*2000)
	_, b = postTo(t, srv.URL, "/v1/responses", `{"model":"o3-mini","input":"`+long+`","max_output_tokens":10}`)
	if !strings.Contains(b, `"input_tokens":2004`) || !strings.Contains(b, `"cached_tokens":896`) ||
		!strings.Contains(b, `"reasoning_tokens":5`) || !strings.Contains(b, `"output_tokens":10`) {
		t.Errorf("responses usage: %s", b)
	}
	_, b = postTo(t, srv.URL, "/v1/responses", `{"model":"gpt-4o","input":"hi","stream":true}`)
	if !strings.Contains(b, "event: response.completed") || !strings.Contains(b, `"sequence_number":`) {
		t.Errorf("responses stream: %s", b)
	}
}

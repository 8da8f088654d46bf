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

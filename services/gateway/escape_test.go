package gateway

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/demo/mockllm"
)

// TestEscapedNamesAreServedAsAuthorised, through `sluice gateway` in front
// of a provider that logs the model it served: what the gateway decides
// on — the model it authorises, routes and meters — is what the provider
// reads. A key allowed only gpt-4o-mini cannot have gpt-4o served by
// naming model twice, once escaped or in another case; a name spelt with
// escapes is read as the provider reads it.
func TestEscapedNamesAreServedAsAuthorised(t *testing.T) {
	var (
		mu     sync.Mutex
		served []string
	)
	up := mock(t, mockllm.Options{Served: func(_, model string) {
		mu.Lock()
		defer mu.Unlock()
		served = append(served, model)
	}})
	url, _ := runGateway(t, testConfig(t), strings.TrimSuffix(up, "/v1"))
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		body   string
		status int
		served string // "" when nothing may reach the provider
	}{
		{`{"model":"gpt-4o-mini","mod\u0065l":"gpt-4o",` + msgs + `}`, http.StatusBadRequest, ""},
		{`{"mod\u0065l":"gpt-4o-mini","model":"gpt-4o",` + msgs + `}`, http.StatusBadRequest, ""},
		{`{"model":"gpt-4o-mini","Model":"gpt-4o",` + msgs + `}`, http.StatusBadRequest, ""},
		{`{"MODEL":"gpt-4o",` + msgs + `}`, http.StatusBadRequest, ""},
		{`{"mod\u0065l":"gpt-4o",` + msgs + `}`, http.StatusForbidden, ""},
		{`{"mod\u0065l":"gpt-4o-mini",` + msgs + `}`, http.StatusOK, "gpt-4o-mini"},
		{`{"model":"gpt-4o-mini","stre\u0061m":false,` + msgs + `}`, http.StatusOK, "gpt-4o-mini"},
	} {
		mu.Lock()
		before := len(served)
		mu.Unlock()
		resp, body := post(t, url, "/v1/chat/completions", "sk-mini-only", c.body)
		mu.Lock()
		got := served[before:]
		mu.Unlock()
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.body, resp.StatusCode, body, c.status)
		}
		if (c.served == "" && len(got) != 0) || (c.served != "" && (len(got) != 1 || got[0] != c.served)) {
			t.Errorf("%s: the provider served %v, want %q", c.body, got, c.served)
		}
	}
}

// TestEscapedNamesAreEstimated: a body spelling its messages and output
// bound with escapes is estimated (and debited) as the plain body, not as
// a one-token request.
func TestEscapedNamesAreEstimated(t *testing.T) {
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{})), Deps{})
	text := strings.Repeat("many words to count here ", 400)
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme",
		`{"model":"gpt-4o","m\u0065ssages":[{"role":"user","content":"`+text+`"}],"max_tok\u0065ns":5000}`, "X-Request-Id", "escaped")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, ev := range g.sink.Events() {
		if ev.Estimated && ev.Attributes["request_id"] == "escaped" {
			if ev.PromptTokens < 1000 || ev.CompletionTokens != 5000 {
				t.Fatalf("estimate %d prompt + %d completion tokens, want the text's 2000-odd and max_tokens' 5000", ev.PromptTokens, ev.CompletionTokens)
			}
			return
		}
	}
	t.Fatalf("no estimate event: %+v", g.sink.Events())
}

package providerusage

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// vector is one case of testdata/vectors.json, which the Python SDK's
// tests (sluice_metering.usage) read too.
type vector struct {
	Name     string          `json:"name"`
	Dialect  string          `json:"dialect"`
	Response json.RawMessage `json:"response"`
	Usage    *struct {
		Prompt     int64 `json:"prompt_tokens"`
		Completion int64 `json:"completion_tokens"`
		Cached     int64 `json:"cached_tokens"`
		CacheWrite int64 `json:"cache_write_tokens"`
		Reasoning  int64 `json:"reasoning_tokens"`
	} `json:"usage"`
}

// TestVectorsReadEveryTokenType: each provider answer of the shared
// vectors reads as the token types it bills — the prompt with its cached
// and cache-write parts, the completion with its reasoning part — and an
// answer without usage reads as none, so the gateway counts it itself.
func TestVectorsReadEveryTokenType(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			got, ok, err := FromResponse(v.Dialect, v.Response)
			if err != nil {
				t.Fatal(err)
			}
			if v.Usage == nil {
				if ok {
					t.Fatalf("read %+v from an answer without usage", got)
				}
				return
			}
			want := middleware.Usage{PromptTokens: v.Usage.Prompt, CompletionTokens: v.Usage.Completion, CachedTokens: v.Usage.Cached,
				CacheWriteTokens: v.Usage.CacheWrite, ReasoningTokens: v.Usage.Reasoning}
			if !ok || got != want {
				t.Fatalf("got %+v (reported %v), want %+v", got, ok, want)
			}
		})
	}
}

// TestFromResponseRefusesWhatItCannotRead: an answer that is not JSON,
// a usage block of the wrong shape and an unknown dialect are errors that
// say what was wrong.
func TestFromResponseRefusesWhatItCannotRead(t *testing.T) {
	for _, tc := range []struct{ dialect, body string }{
		{DialectOpenAI, `not json`},
		{DialectAnthropic, `{"usage":{"input_tokens":"many"}}`},
		{"cohere", `{"usage":{}}`},
	} {
		if _, ok, err := FromResponse(tc.dialect, []byte(tc.body)); err == nil || ok {
			t.Errorf("%s %s: no error", tc.dialect, tc.body)
		}
	}
}

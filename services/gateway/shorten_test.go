package gateway

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// TestWithMaxTokensCapsEachDialectsMember: a shortened call's output cap
// lands in the member its provider reads — lowered where the request set
// more, kept where it set less, added where it set none — and nothing
// else in the body changes.
func TestWithMaxTokensCapsEachDialectsMember(t *testing.T) {
	for _, tc := range []struct {
		name, dialect, op, body string
		want                    map[string]any
	}{
		{"chat without a cap", policy.DialectOpenAI, "/chat/completions", `{"model":"m","messages":[]}`,
			map[string]any{"max_completion_tokens": 16.0}},
		{"chat above", policy.DialectOpenAI, "/chat/completions", `{"model":"m","max_tokens":200,"max_completion_tokens":100,"messages":[]}`,
			map[string]any{"max_tokens": 16.0, "max_completion_tokens": 16.0}},
		{"chat below", policy.DialectAzure, "/chat/completions", `{"max_tokens":8,"messages":[]}`,
			map[string]any{"max_tokens": 8.0}},
		{"chat null", policy.DialectOpenAI, "/chat/completions", `{"max_tokens":null,"messages":[]}`,
			map[string]any{"max_tokens": nil, "max_completion_tokens": 16.0}},
		{"responses", policy.DialectOpenAI, "/responses", `{"model":"m","input":"hi","max_output_tokens":4096}`,
			map[string]any{"max_output_tokens": 16.0}},
		{"completions", policy.DialectOpenAI, "/completions", `{"model":"m","prompt":"hi"}`,
			map[string]any{"max_tokens": 16.0}},
		{"anthropic", policy.DialectAnthropic, "/messages", `{"model":"m","max_tokens":1024,"messages":[]}`,
			map[string]any{"max_tokens": 16.0}},
		{"gemini", policy.DialectGemini, "", `{"contents":[],"generationConfig":{"maxOutputTokens":2048,"temperature":0.5}}`,
			map[string]any{"generationConfig": map[string]any{"maxOutputTokens": 16.0, "temperature": 0.5}}},
		{"gemini without a config", policy.DialectGemini, "", `{"contents":[]}`,
			map[string]any{"generationConfig": map[string]any{"maxOutputTokens": 16.0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := withMaxTokens([]byte(tc.body), tc.dialect, tc.op, 16)
			if err != nil {
				t.Fatal(err)
			}
			var got, in map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal([]byte(tc.body), &in)
			for k, v := range tc.want {
				if !reflect.DeepEqual(got[k], v) {
					t.Errorf("%s = %v, want %v (body %s)", k, got[k], v, out)
				}
			}
			for k, v := range in {
				if _, capped := tc.want[k]; !capped && !reflect.DeepEqual(got[k], v) {
					t.Errorf("%s changed: %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

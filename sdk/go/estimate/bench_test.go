package estimate

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// BenchmarkEstimateChat measures estimate_chat_ns and
// estimate_chat_allocs: Estimator.Estimate of a 1.8 KB chat completions
// request with content parts, an image, a tool call and a tool definition
// (testdata/requests/chat_tools.json) for a tenant with a learned ratio,
// one core.
func BenchmarkEstimateChat(b *testing.B) {
	benchEstimate(b, readRequest(b, "chat_tools.json"), "estimate_chat")
}

// BenchmarkEstimateLongPrompt measures estimate_long_prompt_ns: a chat
// request of about 110 KB: prose, Go, Chinese and JSON in 40 messages,
// without max_tokens so the learned ratio is read.
func BenchmarkEstimateLongPrompt(b *testing.B) {
	var msgs []map[string]string
	for _, name := range []string{"english_prose.txt", "go_code.txt", "chinese.txt", "json_data.txt"} {
		text := readTestdata(b, "corpus", name)
		for range 10 {
			msgs = append(msgs, map[string]string{"role": "user", "content": strings.Repeat(string(text), 2)})
		}
	}
	body, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": msgs})
	benchEstimate(b, body, "estimate_long_prompt")
}

func benchEstimate(b *testing.B, body []byte, key string) {
	e, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	req, err := Parse(ChatCompletions, body, DefaultLimits())
	if err != nil {
		b.Fatal(err)
	}
	e.Observe("acme", req.Model, 100, 40)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.Estimate("acme", ChatCompletions, body); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns, key+"_ns")
	allocs := testing.AllocsPerRun(100, func() { _, _ = e.Estimate("acme", ChatCompletions, body) })
	b.ReportMetric(allocs, key+"_allocs")
}

// BenchmarkCount measures Count alone over the whole corpus (prose, code,
// JSON, logs, five languages), reported per byte as MB/s.
func BenchmarkCount(b *testing.B) {
	entries, err := os.ReadDir("testdata/corpus")
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	for _, en := range entries {
		if strings.HasSuffix(en.Name(), ".txt") {
			sb.Write(readTestdata(b, "corpus", en.Name()))
		}
	}
	text := sb.String()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		_ = Count(O200k, text)
	}
}

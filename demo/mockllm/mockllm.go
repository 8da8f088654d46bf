// Package mockllm is an OpenAI-compatible chat completions upstream for the
// demo and the end-to-end tests: it answers POST /v1/chat/completions with a
// canned reply and a realistic `usage` block — also for streaming responses,
// where usage arrives in the last chunk as with stream_options.include_usage
// — so the reference gateway meters exactly what a real provider would bill.
package mockllm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Usage is the OpenAI usage block.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	MaxTokens int64 `json:"max_tokens"`
	Stream    bool  `json:"stream"`
}

// Handler serves the mock API. Token counts are deterministic: about four
// characters per prompt token plus a few per message, and max_tokens
// completion tokens (default 64), so tests can predict the usage.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", serveChat)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"gpt-4o","object":"model"},{"id":"gpt-4o-mini","object":"model"}]}`))
	})
	return mux
}

// PromptTokens is the mock tokenizer: what the usage block reports for a
// prompt made of these message contents.
func PromptTokens(contents ...string) int64 {
	var n int64
	for _, c := range contents {
		n += int64(len(c)+3)/4 + 4
	}
	return n
}

func serveChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if req.Model == "" || len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "model and messages are required")
		return
	}
	contents := make([]string, len(req.Messages))
	for i, m := range req.Messages {
		contents[i] = m.Content
	}
	completion := req.MaxTokens
	if completion <= 0 {
		completion = 64
	}
	u := Usage{PromptTokens: PromptTokens(contents...), CompletionTokens: completion}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	id := fmt.Sprintf("chatcmpl-%d", time.Now().UnixNano())
	reply := strings.Repeat("ok ", int(min(completion, 32)))

	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": reply}}},
			"usage": u,
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	for _, word := range strings.Fields(reply) {
		send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": word + " "}}}})
	}
	send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "delta": map[string]string{}, "finish_reason": "stop"}}})
	send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": req.Model, "choices": []any{}, "usage": u})
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}})
}

// ParseUsage extracts the usage block from a response body: a JSON
// completion, or an SSE stream whose last data chunk carries usage. It is
// what a gateway does to meter a response it proxied.
func ParseUsage(contentType string, body []byte) (Usage, bool) {
	if strings.HasPrefix(contentType, "text/event-stream") {
		var last Usage
		found := false
		for _, line := range strings.Split(string(body), "\n") {
			data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var chunk struct {
				Usage *Usage `json:"usage"`
			}
			if json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil {
				last, found = *chunk.Usage, true
			}
		}
		return last, found
	}
	var resp struct {
		Usage *Usage `json:"usage"`
	}
	if json.Unmarshal(body, &resp) != nil || resp.Usage == nil {
		return Usage{}, false
	}
	return *resp.Usage, true
}

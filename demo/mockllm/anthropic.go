package mockllm

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

// Anthropic's Messages API, mocked: POST /v1/messages (plain and
// streamed, in Anthropic's event sequence) and /v1/messages/count_tokens.
// A request must carry x-api-key (Options.AnthropicKey when set) and
// anthropic-version, as Anthropic's API requires. What each call was
// billed goes to Options.Charged: for a stream the client cut, the output
// sent until the cut.

// Charge is what the mock billed for one call, by token type, as the
// provider's usage reports it (Anthropic's input_tokens leave the cache
// out; Gemini's promptTokenCount counts it).
type Charge struct {
	Endpoint, Model string
	// Key is the x-api-key (Gemini: x-goog-api-key) the call came with.
	Key                                  string
	Input, Output, CacheRead, CacheWrite int64
	// Reasoning is Gemini's thoughtsTokenCount, billed as output beside
	// Output.
	Reasoning int64
	// Cut marks a stream its client left before its end.
	Cut bool
}

// AnthropicUsage is the usage block of Anthropic's messages.
type AnthropicUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

// AnthropicCache splits a prompt of prompt tokens as the mock bills it:
// with cache_control in the request and at least 1,024 tokens, half of it
// (whole blocks of 128) is read from the cache and a quarter written to
// it; the rest, or all of it otherwise, is input.
func AnthropicCache(prompt int64, cacheControl bool) (input, read, write int64) {
	if !cacheControl || prompt < 1024 {
		return prompt, 0, 0
	}
	read, write = prompt/2/128*128, prompt/4
	return prompt - read - write, read, write
}

type anthropicRequest struct {
	Model     string `json:"model"`
	MaxTokens int64  `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	System    json.RawMessage
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// anthropicPrompt reads a Messages request: its model and its prompt's
// tokens split as billed, or writes Anthropic's error and returns false.
func (m *mock) anthropicPrompt(w http.ResponseWriter, r *http.Request, needMax bool) (anthropicRequest, AnthropicUsage, bool) {
	var req anthropicRequest
	if key := r.Header.Get("X-Api-Key"); key == "" || (m.opts.AnthropicKey != "" && key != m.opts.AnthropicKey) {
		anthropicErr(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
		return req, AnthropicUsage{}, false
	}
	if r.Header.Get("Anthropic-Version") == "" {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return req, AnthropicUsage{}, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 8<<20))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || req.Model == "" || len(req.Messages) == 0 || (needMax && req.MaxTokens <= 0) {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "model, messages and max_tokens are required")
		return req, AnthropicUsage{}, false
	}
	m.served(r, req.Model)
	contents := []string{}
	if len(req.System) > 0 {
		contents = append(contents, text(req.System))
	}
	for _, msg := range req.Messages {
		contents = append(contents, text(msg.Content))
	}
	var u AnthropicUsage
	u.InputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens =
		AnthropicCache(PromptTokens(contents...), bytes.Contains(body, []byte(`"cache_control"`)))
	return req, u, true
}

func (m *mock) anthropicMessages(w http.ResponseWriter, r *http.Request) {
	req, u, ok := m.anthropicPrompt(w, r, true)
	if !ok {
		return
	}
	u.OutputTokens = req.MaxTokens
	id := m.id("msg")
	answer := reply(req.MaxTokens)
	ch := Charge{Endpoint: r.URL.Path, Model: req.Model, Key: r.Header.Get("X-Api-Key"),
		Input: u.InputTokens, CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens}
	w.Header().Set("Request-Id", "req_"+id)
	if !req.Stream {
		ch.Output = u.OutputTokens
		m.charged(ch)
		writeJSON(w, map[string]any{"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content": []any{map[string]any{"type": "text", "text": answer}}, "stop_reason": "end_turn",
			"stop_sequence": nil, "usage": u})
		return
	}
	s := m.stream(w)
	start := u
	start.OutputTokens = 1 // as Anthropic: the first token, counted at message_start
	s.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message",
		"role": "assistant", "model": req.Model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": start}})
	s.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]any{"type": "text", "text": ""}})
	s.event("ping", map[string]any{"type": "ping"})
	words := strings.Fields(answer)
	for i, word := range words {
		if r.Context().Err() != nil {
			// The client left: billed the output generated until then.
			ch.Output, ch.Cut = max(int64(i), 1), true
			m.charged(ch)
			return
		}
		s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": word + " "}})
	}
	s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	s.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]int64{"output_tokens": u.OutputTokens}})
	s.event("message_stop", map[string]any{"type": "message_stop"})
	ch.Output = u.OutputTokens
	m.charged(ch)
}

func (m *mock) anthropicCountTokens(w http.ResponseWriter, r *http.Request) {
	_, u, ok := m.anthropicPrompt(w, r, false)
	if !ok {
		return
	}
	writeJSON(w, map[string]int64{"input_tokens": u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens})
}

// charged reports a call's bill to opts.Charged.
func (m *mock) charged(c Charge) {
	if m.opts.Charged != nil {
		m.opts.Charged(c)
	}
}

func anthropicErr(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

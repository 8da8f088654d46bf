// Package mockllm is an OpenAI-compatible upstream for the demo, the
// end-to-end tests and the gateway's tests and benchmarks. It answers
// chat completions (text, tool calls, streams), legacy completions,
// embeddings (float or base64) and the Responses API (plain and
// streamed), Anthropic's Messages API (anthropic.go) and Gemini's
// generateContent (gemini.go), each with a
// deterministic, realistic usage block — cached prompt tokens for long
// prompts, reasoning tokens for o-series models, Anthropic's cache reads
// and writes, Gemini's cached content and thoughts included — so that a gateway in front of it can be checked to meter
// exactly what a real provider would bill.
//
// How a stream reports usage is Options.StreamUsage: always (the default
// of Handler, which the reference gateway relies on), only when the
// request asks with stream_options.include_usage (as OpenAI does), or
// never (a provider that reports no usage at all, in streams or not).
package mockllm

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Usage is the OpenAI usage block of chat completions, completions and
// embeddings, with the details OpenAI adds where they apply.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`

	PromptDetails     *PromptDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionDetails *CompletionDetails `json:"completion_tokens_details,omitempty"`
}

// PromptDetails is usage.prompt_tokens_details.
type PromptDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// CompletionDetails is usage.completion_tokens_details.
type CompletionDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// ResponsesUsage is the Responses API's usage block.
type ResponsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// StreamUsage says when a stream carries a usage chunk.
type StreamUsage uint8

// The stream usage behaviours.
const (
	// UsageAlways sends the usage chunk at the end of every stream.
	UsageAlways StreamUsage = iota
	// UsageWhenAsked sends it only with stream_options.include_usage, and
	// then "usage": null on every other chunk, as OpenAI does.
	UsageWhenAsked
	// UsageNever reports no usage anywhere, streamed or not.
	UsageNever
)

// Options configure the mock.
type Options struct {
	StreamUsage StreamUsage
	// ChunkDelay, when set, is waited before each streamed chunk (for
	// tests that need a stream still open).
	ChunkDelay time.Duration
	// Capacity, when above 0, makes the mock a saturating upstream for the
	// models in CapacityModels (every model when empty): up to Capacity
	// calls in flight each waits Latency before it is answered; past it
	// calls share the capacity and wait Latency × in flight / Capacity, as
	// the bench upstream of the priority benchmarks does. The demo gives
	// its premium model such a capacity.
	Capacity       int
	Latency        time.Duration
	CapacityModels []string
	// Served, when set, learns the endpoint and the model of each request
	// the mock answers, as its decoder read them: Go's encoding/json,
	// which decodes escapes in member names, keeps the last of two members
	// of one name and matches names ignoring case. The provider's own log
	// of what it served, for tests of what the gateway let through.
	Served func(endpoint, model string)
	// AzureKey, when set, is the only api-key Azure OpenAI's deployment
	// routes accept (401 otherwise); any key when empty.
	AzureKey string
	// AnthropicKey, when set, is the only x-api-key the Anthropic routes
	// accept (401 authentication_error otherwise); any key when empty.
	AnthropicKey string
	// GeminiKey, when set, is the only x-goog-api-key (or ?key=) the
	// Gemini routes accept (403 PERMISSION_DENIED otherwise); any key
	// when empty.
	GeminiKey string
	// Charged, when set, learns what each Anthropic or Gemini call was
	// billed, token type by token type: the provider's own log of its bill.
	Charged func(Charge)
}

// Handler serves the mock API with the default Options (usage in every
// stream). Token counts are deterministic: PromptTokens per message or
// input, and max_tokens completion tokens (default 64), so tests can
// predict the usage.
func Handler() http.Handler { return New(Options{}) }

// New serves the mock API with opts.
func New(opts Options) http.Handler {
	m := &mock{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", m.chat)
	mux.HandleFunc("POST /v1/completions", m.completions)
	mux.HandleFunc("POST /v1/embeddings", m.embeddings)
	mux.HandleFunc("POST /v1/responses", m.responses)
	// Azure OpenAI: the same operations under deployment URLs, with
	// api-key and api-version (Served learns the deployment in the path).
	for op, h := range map[string]http.HandlerFunc{"chat/completions": m.chat, "completions": m.completions, "embeddings": m.embeddings} {
		mux.HandleFunc("POST /openai/deployments/{deployment}/"+op, m.azure(h))
	}
	mux.HandleFunc("POST /v1/messages", m.anthropicMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", m.anthropicCountTokens)
	mux.HandleFunc("POST /v1beta/models/{target}", m.gemini)
	mux.HandleFunc("POST /v1/models/{target}", m.gemini)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"gpt-4o","object":"model"},{"id":"gpt-4o-mini","object":"model"}]}`))
	})
	if opts.Capacity <= 0 {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			mux.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil {
			writeError(w, http.StatusBadRequest, "the body could not be read")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct{ Model string }
		_ = json.Unmarshal(body, &req)
		if len(opts.CapacityModels) == 0 || slices.Contains(opts.CapacityModels, req.Model) {
			n := m.inflight.Add(1)
			defer m.inflight.Add(-1)
			lat := opts.Latency
			if int(n) > opts.Capacity {
				lat = time.Duration(float64(lat) * float64(n) / float64(opts.Capacity))
			}
			select {
			case <-time.After(lat):
			case <-r.Context().Done():
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

type mock struct {
	opts     Options
	seq      atomic.Int64
	inflight atomic.Int64
}

// PromptTokens is the mock tokenizer: what the usage block reports for a
// prompt made of these message contents (about four characters a token
// plus four per message).
func PromptTokens(contents ...string) int64 {
	var n int64
	for _, c := range contents {
		n += int64(len(c)+3)/4 + 4
	}
	return n
}

// CachedTokens is the part of a prompt the mock reports as served from
// the prompt cache: as OpenAI, nothing below 1,024 tokens, above it half
// the prompt in whole blocks of 128.
func CachedTokens(prompt int64) int64 {
	if prompt < 1024 {
		return 0
	}
	return prompt / 2 / 128 * 128
}

// ReasoningTokens is the part of a completion the mock reports as
// reasoning: half of it for o-series models (o1, o3-mini …), none for
// others.
func ReasoningTokens(model string, completion int64) int64 {
	if len(model) > 1 && model[0] == 'o' && model[1] >= '0' && model[1] <= '9' {
		return completion / 2
	}
	return 0
}

// chatUsage is the usage of a call with these prompt and completion tokens.
func chatUsage(model string, prompt, completion int64) Usage {
	u := Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if c := CachedTokens(prompt); c > 0 {
		u.PromptDetails = &PromptDetails{CachedTokens: c}
	}
	if r := ReasoningTokens(model, completion); r > 0 {
		u.CompletionDetails = &CompletionDetails{ReasoningTokens: r}
	}
	return u
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
}

type chatRequest struct {
	Model         string            `json:"model"`
	Messages      []chatMessage     `json:"messages"`
	Tools         []json.RawMessage `json:"tools"`
	MaxTokens     int64             `json:"max_tokens"`
	MaxCompletion int64             `json:"max_completion_tokens"`
	Stream        bool              `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// text returns a message content's text: a string, or the text of its
// parts.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

// served reports a request answered to opts.Served.
func (m *mock) served(r *http.Request, model string) {
	if m.opts.Served != nil {
		m.opts.Served(r.URL.Path, model)
	}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

func completionTokens(maxTokens, maxCompletion int64) int64 {
	c := max(maxTokens, maxCompletion)
	if c <= 0 {
		c = 64
	}
	return c
}

// reply is the canned answer for a completion of n tokens.
func reply(n int64) string { return strings.Repeat("ok ", int(min(n, 32))) }

func (m *mock) id(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), m.seq.Add(1))
}

func (m *mock) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !decode(w, r, &req) {
		return
	}
	m.served(r, req.Model)
	if req.Model == "" || len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "model and messages are required")
		return
	}
	contents := make([]string, 0, len(req.Messages)+len(req.Tools))
	for _, msg := range req.Messages {
		contents = append(contents, text(msg.Content))
	}
	for _, t := range req.Tools {
		contents = append(contents, string(t))
	}
	completion := completionTokens(req.MaxTokens, req.MaxCompletion)
	u := chatUsage(req.Model, PromptTokens(contents...), completion)
	id := m.id("chatcmpl")
	// With tools and a user turn last, the model calls the first tool; a
	// tool result last gets a text answer, as a real model would.
	var call *toolCall
	if len(req.Tools) > 0 && req.Messages[len(req.Messages)-1].Role == "user" {
		var tool struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		_ = json.Unmarshal(req.Tools[0], &tool)
		call = &toolCall{ID: "call_" + id, Type: "function", Name: tool.Function.Name, Arguments: `{"city":"Paris"}`}
	}
	answer := reply(completion)
	if !req.Stream {
		msg := map[string]any{"role": "assistant", "content": answer}
		finish := "stop"
		if call != nil {
			msg = map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call.json(true)}}
			finish = "tool_calls"
		}
		body := map[string]any{"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "message": msg}}}
		if m.opts.StreamUsage != UsageNever {
			body["usage"] = u
		}
		writeJSON(w, body)
		return
	}
	withUsage := m.opts.StreamUsage == UsageAlways || (m.opts.StreamUsage == UsageWhenAsked && req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	s := m.stream(w)
	chunk := func(choices []any) map[string]any {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Model, "choices": choices}
		if withUsage && m.opts.StreamUsage == UsageWhenAsked {
			c["usage"] = nil
		}
		return c
	}
	if call != nil {
		s.data(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call.json(false)}}}}))
		for _, part := range []string{`{"city":`, `"Paris"}`} {
			s.data(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": part}}}}}}))
		}
		s.data(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": "tool_calls"}}))
	} else {
		s.data(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}}}))
		for _, word := range strings.Fields(answer) {
			s.data(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{"content": word + " "}}}))
		}
		s.data(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": "stop"}}))
	}
	if withUsage {
		c := chunk([]any{})
		c["usage"] = u
		s.data(c)
	}
	s.done()
}

type toolCall struct {
	ID, Type, Name, Arguments string
}

// json is the call as a message (whole) or as the first delta of a stream
// (with its index, arguments to follow).
func (c *toolCall) json(whole bool) map[string]any {
	out := map[string]any{"id": c.ID, "type": c.Type, "function": map[string]any{"name": c.Name, "arguments": ""}}
	if whole {
		out["function"] = map[string]any{"name": c.Name, "arguments": c.Arguments}
	} else {
		out["index"] = 0
	}
	return out
}

// sse writes one streamed answer.
type sse struct {
	w     http.ResponseWriter
	f     http.Flusher
	delay time.Duration
}

func (m *mock) stream(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	f, _ := w.(http.Flusher)
	return &sse{w: w, f: f, delay: m.opts.ChunkDelay}
}

func (s *sse) event(name string, v any) {
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	b, _ := json.Marshal(v)
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", b)
	if s.f != nil {
		s.f.Flush()
	}
}

func (s *sse) data(v any) { s.event("", v) }

func (s *sse) done() {
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	if s.f != nil {
		s.f.Flush()
	}
}

// prompts reads a completions prompt or an embeddings input: a string or
// a list of strings (token-id arrays count one token per id).
func prompts(raw json.RawMessage) ([]string, int64, bool) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, 0, true
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		return many, 0, true
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return nil, int64(len(ids)), true
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		var n int64
		for _, x := range idss {
			n += int64(len(x))
		}
		return nil, n, true
	}
	return nil, 0, false
}

// inputTokens counts inputs without the per-message overhead of chat.
func inputTokens(texts []string) int64 {
	var n int64
	for _, t := range texts {
		n += int64(len(t)+3) / 4
	}
	return n
}

func (m *mock) completions(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model         string          `json:"model"`
		Prompt        json.RawMessage `json:"prompt"`
		MaxTokens     int64           `json:"max_tokens"`
		Stream        bool            `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if !decode(w, r, &req) {
		return
	}
	m.served(r, req.Model)
	texts, ids, ok := prompts(req.Prompt)
	if req.Model == "" || !ok {
		writeError(w, http.StatusBadRequest, "model and prompt are required")
		return
	}
	completion := completionTokens(req.MaxTokens, 0)
	u := chatUsage(req.Model, inputTokens(texts)+ids, completion)
	id := m.id("cmpl")
	answer := reply(completion)
	if !req.Stream {
		body := map[string]any{"id": id, "object": "text_completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "text": answer, "finish_reason": "stop", "logprobs": nil}}}
		if m.opts.StreamUsage != UsageNever {
			body["usage"] = u
		}
		writeJSON(w, body)
		return
	}
	withUsage := m.opts.StreamUsage == UsageAlways || (m.opts.StreamUsage == UsageWhenAsked && req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	s := m.stream(w)
	for _, word := range strings.Fields(answer) {
		s.data(map[string]any{"id": id, "object": "text_completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "text": word + " ", "finish_reason": nil, "logprobs": nil}}})
	}
	if withUsage {
		s.data(map[string]any{"id": id, "object": "text_completion", "created": time.Now().Unix(), "model": req.Model, "choices": []any{}, "usage": u})
	}
	s.done()
}

func (m *mock) embeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		Dimensions     int             `json:"dimensions"`
		EncodingFormat string          `json:"encoding_format"`
	}
	if !decode(w, r, &req) {
		return
	}
	m.served(r, req.Model)
	texts, ids, ok := prompts(req.Input)
	if req.Model == "" || !ok {
		writeError(w, http.StatusBadRequest, "model and input are required")
		return
	}
	dims := req.Dimensions
	if dims <= 0 || dims > 4096 {
		dims = 8
	}
	n := max(len(texts), 1)
	data := make([]any, n)
	for i := range n {
		vec := make([]float32, dims)
		for j := range vec {
			vec[j] = float32(i+1) / float32(j+1)
		}
		var emb any = vec
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*dims)
			for j, v := range vec {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
			}
			emb = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": emb}
	}
	prompt := inputTokens(texts) + ids
	body := map[string]any{"object": "list", "model": req.Model, "data": data}
	if m.opts.StreamUsage != UsageNever {
		body["usage"] = map[string]int64{"prompt_tokens": prompt, "total_tokens": prompt}
	}
	writeJSON(w, body)
}

func (m *mock) responses(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model           string          `json:"model"`
		Input           json.RawMessage `json:"input"`
		Instructions    string          `json:"instructions"`
		MaxOutputTokens int64           `json:"max_output_tokens"`
		Stream          bool            `json:"stream"`
	}
	if !decode(w, r, &req) {
		return
	}
	m.served(r, req.Model)
	var contents []string
	var one string
	if json.Unmarshal(req.Input, &one) == nil {
		contents = append(contents, one)
	} else {
		var items []struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(req.Input, &items) != nil {
			writeError(w, http.StatusBadRequest, "input must be a string or a list of items")
			return
		}
		for _, it := range items {
			contents = append(contents, text(it.Content))
		}
	}
	if req.Model == "" || len(contents) == 0 {
		writeError(w, http.StatusBadRequest, "model and input are required")
		return
	}
	if req.Instructions != "" {
		contents = append(contents, req.Instructions)
	}
	completion := completionTokens(req.MaxOutputTokens, 0)
	cu := chatUsage(req.Model, PromptTokens(contents...), completion)
	var u ResponsesUsage
	u.InputTokens, u.OutputTokens, u.TotalTokens = cu.PromptTokens, cu.CompletionTokens, cu.TotalTokens
	u.InputTokensDetails.CachedTokens = CachedTokens(cu.PromptTokens)
	u.OutputTokensDetails.ReasoningTokens = ReasoningTokens(req.Model, completion)
	id, msgID := m.id("resp"), m.id("msg")
	answer := reply(completion)
	created := time.Now().Unix()
	response := func(status string, output []any, usage bool) map[string]any {
		out := map[string]any{"id": id, "object": "response", "created_at": created, "status": status, "model": req.Model,
			"output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}, "error": nil,
			"incomplete_details": nil, "instructions": nil, "metadata": map[string]any{}, "temperature": 1.0, "top_p": 1.0,
			"text": map[string]any{"format": map[string]any{"type": "text"}}}
		if usage && m.opts.StreamUsage != UsageNever {
			out["usage"] = u
		} else {
			out["usage"] = nil
		}
		return out
	}
	part := func(t string) map[string]any {
		return map[string]any{"type": "output_text", "text": t, "annotations": []any{}}
	}
	item := func(status string, content []any) map[string]any {
		return map[string]any{"id": msgID, "type": "message", "status": status, "role": "assistant", "content": content}
	}
	final := response("completed", []any{item("completed", []any{part(answer)})}, true)
	if !req.Stream {
		writeJSON(w, final)
		return
	}
	s := m.stream(w)
	seq := 0
	ev := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		s.event(typ, fields)
	}
	ev("response.created", map[string]any{"response": response("in_progress", []any{}, false)})
	ev("response.in_progress", map[string]any{"response": response("in_progress", []any{}, false)})
	ev("response.output_item.added", map[string]any{"output_index": 0, "item": item("in_progress", []any{})})
	ev("response.content_part.added", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part("")})
	for _, word := range strings.Fields(answer) {
		ev("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "delta": word + " ", "logprobs": []any{}})
	}
	ev("response.output_text.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "text": answer, "logprobs": []any{}})
	ev("response.content_part.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part(answer)})
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item("completed", []any{part(answer)})})
	ev("response.completed", map[string]any{"response": final})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
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

// azure serves h as Azure OpenAI does: only with an api-key (opts.AzureKey
// when set) and an api-version.
func (m *mock) azure(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if key := r.Header.Get("Api-Key"); key == "" || (m.opts.AzureKey != "" && key != m.opts.AzureKey) {
			writeError(w, http.StatusUnauthorized, "Access denied due to invalid subscription key or wrong API endpoint.")
			return
		}
		if r.URL.Query().Get("api-version") == "" {
			writeError(w, http.StatusNotFound, "Resource not found: api-version is missing")
			return
		}
		h(w, r)
	}
}

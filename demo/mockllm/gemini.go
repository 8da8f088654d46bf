package mockllm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Google's Gemini API, mocked: POST /v1beta/models/{model}:generateContent
// and :streamGenerateContent (Server Sent Events with ?alt=sse, a JSON
// array of responses otherwise), answered in Gemini's format with its
// usageMetadata, and :countTokens. A request must carry x-goog-api-key (Options.GeminiKey
// when set). What each call was billed goes to Options.Charged: Input is
// promptTokenCount (the cached content included, as Gemini counts it),
// CacheRead cachedContentTokenCount, Output candidatesTokenCount and
// Reasoning thoughtsTokenCount; for a stream the client cut, the output
// sent until the cut.

// GeminiCachedTokens is what a request naming cachedContent reads from
// the cache, on top of its own prompt.
const GeminiCachedTokens = 2048

// GeminiUsage is Gemini's usageMetadata, as the mock reports it.
type GeminiUsage struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount,omitempty"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount,omitempty"`
	TotalTokenCount         int64 `json:"totalTokenCount"`
}

type geminiContent struct {
	Role  string `json:"role"`
	Parts []struct {
		Text string `json:"text"`
	} `json:"parts"`
}

type geminiRequest struct {
	Contents          []geminiContent `json:"contents"`
	SystemInstruction *geminiContent  `json:"systemInstruction"`
	CachedContent     string          `json:"cachedContent"`
	GenerationConfig  struct {
		MaxOutputTokens int64 `json:"maxOutputTokens"`
		// Google's API reads each field in either spelling; google-genai
		// sends thinkingConfig's in snake_case.
		ThinkingConfig struct {
			ThinkingBudget      int64 `json:"thinkingBudget"`
			ThinkingBudgetSnake int64 `json:"thinking_budget"`
		} `json:"thinkingConfig"`
	} `json:"generationConfig"`
}

// geminiPrompt reads a generateContent request: its model, method and
// usage as billed (the output at its bound), or writes Google's error and
// returns false.
func (m *mock) geminiPrompt(w http.ResponseWriter, r *http.Request) (model, method string, u GeminiUsage, ok bool) {
	key := r.Header.Get("X-Goog-Api-Key")
	if key == "" {
		key = r.URL.Query().Get("key")
	}
	if key == "" || (m.opts.GeminiKey != "" && key != m.opts.GeminiKey) {
		googleErr(w, http.StatusForbidden, "PERMISSION_DENIED", "API key not valid. Please pass a valid API key.")
		return "", "", u, false
	}
	target := r.PathValue("target")
	i := strings.LastIndexByte(target, ':')
	if i <= 0 {
		googleErr(w, http.StatusNotFound, "NOT_FOUND", "no such method: "+target)
		return "", "", u, false
	}
	model, method = target[:i], target[i+1:]
	if method != "generateContent" && method != "streamGenerateContent" && method != "countTokens" {
		googleErr(w, http.StatusNotFound, "NOT_FOUND", "no such method: "+method)
		return "", "", u, false
	}
	var req geminiRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 8<<20))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || len(req.Contents) == 0 {
		googleErr(w, http.StatusBadRequest, "INVALID_ARGUMENT", "contents is required")
		return "", "", u, false
	}
	m.served(r, model)
	var texts []string
	for _, c := range append(req.Contents, *orEmpty(req.SystemInstruction)) {
		var b strings.Builder
		for _, p := range c.Parts {
			b.WriteString(p.Text)
		}
		if len(c.Parts) > 0 {
			texts = append(texts, b.String())
		}
	}
	u.PromptTokenCount = PromptTokens(texts...)
	if req.CachedContent != "" {
		u.PromptTokenCount += GeminiCachedTokens
		u.CachedContentTokenCount = GeminiCachedTokens
	}
	u.CandidatesTokenCount = req.GenerationConfig.MaxOutputTokens
	if u.CandidatesTokenCount <= 0 {
		u.CandidatesTokenCount = 64
	}
	tc := req.GenerationConfig.ThinkingConfig
	u.ThoughtsTokenCount = max(0, tc.ThinkingBudget, tc.ThinkingBudgetSnake)
	return model, method, u, true
}

func orEmpty(c *geminiContent) *geminiContent {
	if c == nil {
		return &geminiContent{}
	}
	return c
}

func (u GeminiUsage) withTotal() GeminiUsage {
	u.TotalTokenCount = u.PromptTokenCount + u.CandidatesTokenCount + u.ThoughtsTokenCount
	return u
}

// geminiResponse is one GenerateContentResponse: text from the model, a
// finishReason when it ends the answer, and the usage so far.
func geminiResponse(model, id, text string, final bool, u GeminiUsage) map[string]any {
	cand := map[string]any{"content": map[string]any{"role": "model", "parts": []any{map[string]any{"text": text}}}, "index": 0}
	if final {
		cand["finishReason"] = "STOP"
	}
	return map[string]any{"candidates": []any{cand}, "usageMetadata": u.withTotal(), "modelVersion": model, "responseId": id}
}

func (m *mock) gemini(w http.ResponseWriter, r *http.Request) {
	model, method, u, ok := m.geminiPrompt(w, r)
	if !ok {
		return
	}
	if method == "countTokens" { // free: nothing charged
		writeJSON(w, map[string]int64{"totalTokens": u.PromptTokenCount})
		return
	}
	id := m.id("resp")
	answer := reply(u.CandidatesTokenCount)
	ch := Charge{Endpoint: r.URL.Path, Model: model, Key: r.Header.Get("X-Goog-Api-Key"),
		Input: u.PromptTokenCount, CacheRead: u.CachedContentTokenCount, Reasoning: u.ThoughtsTokenCount}
	if method == "generateContent" {
		ch.Output = u.CandidatesTokenCount
		m.charged(ch)
		writeJSON(w, geminiResponse(model, id, answer, true, u))
		return
	}
	sse := r.URL.Query().Get("alt") == "sse"
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	f, _ := w.(http.Flusher)
	words := strings.Fields(answer)
	for i, word := range words {
		if m.opts.ChunkDelay > 0 {
			time.Sleep(m.opts.ChunkDelay)
		}
		if r.Context().Err() != nil {
			// The client left: billed the output generated until then.
			ch.Output, ch.Cut = max(int64(i), 1), true
			m.charged(ch)
			return
		}
		last := i == len(words)-1
		so := u
		if !last {
			so.CandidatesTokenCount = int64(i + 1) // Gemini's counts so far
		}
		b, _ := json.Marshal(geminiResponse(model, id, word+" ", last, so))
		switch {
		case sse:
			fmt.Fprintf(w, "data: %s\r\n\r\n", b)
		case i == 0:
			fmt.Fprintf(w, "[%s", b)
		default:
			fmt.Fprintf(w, ",\r\n%s", b)
		}
		if !sse && last {
			fmt.Fprint(w, "]")
		}
		if f != nil {
			f.Flush()
		}
	}
	ch.Output = u.CandidatesTokenCount
	m.charged(ch)
}

func googleErr(w http.ResponseWriter, code int, status, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg, "status": status}})
}

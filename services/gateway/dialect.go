package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// The gateway serves each provider's API natively (anthropic.go,
// gemini.go): the body goes to an upstream of the route's dialect as the
// client sent it and the answer comes back as the provider sent it. Only
// the gateway's own answers change shape: the request path writes its
// refusals as OpenAI errors everywhere (the flags, admission, guards,
// intake), and nativeWriter rewrites them into the dialect's error body,
// so that the provider's SDKs raise their own errors.

// dialectOf is the dialect of the API a request path belongs to.
func dialectOf(path string) string {
	switch {
	case path == pathMessages || path == pathCountTokens:
		return policy.DialectAnthropic
	case isGeminiPath(path):
		return policy.DialectGemini
	}
	return policy.DialectOpenAI
}

// errorShape is how a dialect answers the gateway's errors: its error
// body for a status and message, and its rate-limit headers, rewritten
// from OpenAI's x-ratelimit-* on every answer.
type errorShape interface {
	errorBody(status int, msg string) []byte
	headers(h http.Header, now time.Time)
}

// nativeWriter answers the gateway's own errors on a native route in its
// dialect's shape: an error the gateway writes (c.relaying unset) is held
// and rewritten by finish; the upstream's answers pass unchanged.
type nativeWriter struct {
	http.ResponseWriter
	c           *call
	shape       errorShape
	now         func() time.Time
	held        int // the status of a held error; 0 when none
	body        bytes.Buffer
	wroteHeader bool
}

// newNativeWriter wraps w for c's dialect; nil for OpenAI's, whose errors
// the gateway writes as they are.
func newNativeWriter(w http.ResponseWriter, c *call, now func() time.Time) *nativeWriter {
	var shape errorShape
	switch c.dialect {
	case policy.DialectAnthropic:
		shape = anthropicShape{}
	case policy.DialectGemini:
		shape = geminiShape{}
	default:
		return nil
	}
	return &nativeWriter{ResponseWriter: w, c: c, shape: shape, now: now}
}

// maxHeldError bounds a held error body: the gateway's are a few hundred
// bytes; beyond this the rest is dropped (the message is cut, not lost).
const maxHeldError = 16 << 10

func (w *nativeWriter) WriteHeader(code int) {
	if w.wroteHeader || w.held != 0 {
		return
	}
	if code >= 400 && !w.c.relaying {
		w.held = code
		return
	}
	w.wroteHeader = true
	w.shape.headers(w.Header(), w.now())
	w.ResponseWriter.WriteHeader(code)
}

func (w *nativeWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader && w.held == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.held != 0 {
		w.body.Write(b[:min(len(b), max(0, maxHeldError-w.body.Len()))])
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes a relayed answer; a held error waits for finish.
func (w *nativeWriter) Flush() {
	if w.held != 0 {
		return
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *nativeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish writes the held error in the dialect's shape, with the held
// status and message (which names the limit that refused).
func (w *nativeWriter) finish() {
	if w.held == 0 {
		return
	}
	var b ratelimit.Body
	msg := http.StatusText(w.held)
	if json.Unmarshal(w.body.Bytes(), &b) == nil && b.Error.Message != "" {
		msg = b.Error.Message
	}
	h := w.Header()
	w.shape.headers(h, w.now())
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(w.held)
	_, _ = w.ResponseWriter.Write(w.shape.errorBody(w.held, msg))
}

// serveCountTokens passes a native dialect's token count (Anthropic's
// POST /v1/messages/count_tokens, Gemini's models/{model}:countTokens) to
// an upstream of the dialect, authenticated and routed like a generation
// but not metered: counting tokens is free at both and bills none.
func (s *Server) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	c := &call{endpoint: r.URL.Path, start: s.now(), route: "unknown", dialect: dialectOf(r.URL.Path)}
	aw := newNativeWriter(w, c, s.now)
	defer aw.finish()
	c.requestID = r.Header.Get(headerRequestID)
	if !validID(c.requestID) {
		c.requestID = "req_" + randomHex(16)
	}
	aw.Header().Set(headerRequestID, c.requestID)
	if !s.intake(aw, r, c) {
		return
	}
	u := order(c.ups, 1, s.broken)[0]
	resp, done, err := s.attempt(r.Context(), u, u.url(c.operation(), c.req.Model), c.body, c.requestID, r.Header)
	if err != nil {
		writeError(aw, http.StatusBadGateway, "api_error", "upstream_unavailable", fmt.Sprintf("The model provider (%s) could not be reached.", u.cfg.Name))
		return
	}
	defer done()
	defer resp.Body.Close()
	c.relaying = true
	if v := resp.Header.Get("Content-Type"); v != "" {
		aw.Header().Set("Content-Type", v)
	}
	aw.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(aw, io.LimitReader(resp.Body, s.cfg.MaxResponseBytes))
}

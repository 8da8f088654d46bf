// Package refgateway is a minimal LLM gateway built on the Sluice SDK, the
// reference for integrators writing their own gateway and what the SDK's
// end-to-end test (e2e/gateway_test.go) drives — the demo runs `sluice
// gateway` instead:
// it authenticates a caller's API key to a tenant, asks the flag Checker
// (through the SDK middleware) whether the tenant may call the model — a
// local map lookup, no network call — proxies the request to an
// OpenAI-compatible upstream, relaying a streamed answer chunk by chunk,
// and meters it through the middleware: an estimate of the call before it
// runs (estimated: true; NoEstimates turns it off) and its settlement with
// the usage the upstream reported when it ends (the same id), and one
// event per refused call (outcome rejected, zero tokens), so refusals are
// counted. With an admission Limiter it also checks the policy's limits
// (tokens and requests per minute, limits: rules) before the call, after
// the flags: a request over a limit is answered 429 naming the rule and
// never reaches the upstream.
package refgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// Caller is who an API key belongs to.
type Caller struct {
	Tenant   string
	APIKeyID string
}

// Emitter is the part of the SDK Emitter the gateway uses.
type Emitter interface {
	Emit(ev *schemas.UsageEvent) error
}

// Gateway proxies chat completions and meters them.
type Gateway struct {
	// Upstream is the provider's base URL.
	Upstream string
	// Keys maps a bearer API key to its caller.
	Keys map[string]Caller
	// Checker decides per request; Emitter receives usage.
	Checker middleware.Decider
	Emitter Emitter
	// Name is the gateway field of emitted events.
	Name string
	// Client calls the upstream; nil means a client with a 60s timeout.
	Client *http.Client
	// Now is the clock for event times (tests inject one).
	Now func() time.Time
	// Estimator estimates each call before it runs; nil means one with
	// estimate.DefaultConfig.
	Estimator *estimate.Estimator
	// NoEstimates turns the estimate events off: each call is then
	// emitted once, when it settles.
	NoEstimates bool
	// Admission checks each call against the limits before it goes
	// upstream, debiting the estimate and settling the usage the upstream
	// reported (middleware.WithAdmission); nil turns admission off. Build
	// it from policy.Policy.AdmissionRules and call SetRules on a reload.
	Admission *admission.Limiter
}

type ctxKey struct{}

type requestInfo struct {
	caller Caller
	model  string
	body   []byte
}

const maxRequestBody = 4 << 20

// Handler returns the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler {
	if g.Client == nil {
		g.Client = &http.Client{Timeout: 60 * time.Second}
	}
	if g.Now == nil {
		g.Now = time.Now
	}
	if g.Estimator == nil {
		// The default configuration is valid by construction.
		g.Estimator, _ = estimate.New(estimate.DefaultConfig())
	}
	check := middleware.New(g.Checker, func(r *http.Request) (middleware.Identity, bool) {
		info, _ := r.Context().Value(ctxKey{}).(*requestInfo)
		if info == nil {
			return middleware.Identity{}, false
		}
		return middleware.Identity{Tenant: info.caller.Tenant, Model: info.model, APIKeyID: info.caller.APIKeyID}, true
	}, middleware.WithClock(g.Now), middleware.WithEmitter(g.Emitter, g.Name),
		middleware.WithEstimates(g.Estimator), middleware.WithEstimateEvents(!g.NoEstimates),
		middleware.WithAdmission(g.Admission))
	proxy := check(http.HandlerFunc(g.proxy))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		caller, ok := g.Keys[key]
		if !ok {
			openAIError(w, http.StatusUnauthorized, "invalid_api_key", "Incorrect API key provided.")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
		if err != nil {
			openAIError(w, http.StatusRequestEntityTooLarge, "request_too_large", "request body exceeds 4 MiB")
			return
		}
		var req struct {
			Model string `json:"model"`
		}
		if json.Unmarshal(body, &req) != nil || req.Model == "" {
			openAIError(w, http.StatusBadRequest, "invalid_request_error", "body must be JSON with a model")
			return
		}
		info := &requestInfo{caller: caller, model: req.Model, body: body}
		r.Body = io.NopCloser(bytes.NewReader(body)) // the middleware reads it again to estimate
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, info)))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// proxy calls the upstream and relays its answer, reporting the usage it
// carries to the middleware, which emits the settlement when proxy returns.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request) {
	info := r.Context().Value(ctxKey{}).(*requestInfo)
	call := middleware.CallFrom(r.Context()) // never nil: every request passes the metering middleware
	call.SetProvider("mock")
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, g.Upstream+"/v1/chat/completions", bytes.NewReader(info.body))
	if err != nil {
		openAIError(w, http.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.Client.Do(req)
	if err != nil {
		openAIError(w, http.StatusBadGateway, "upstream_error", "upstream unreachable")
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		relayStream(w, resp.Body, call)
		return
	}
	out, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if u, ok := mockllm.ParseUsage(resp.Header.Get("Content-Type"), out); ok {
		call.Report(middleware.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens})
	}
	_, _ = w.Write(out)
}

const (
	maxResponseBody = 32 << 20
	// maxStreamLine bounds the memory one stream holds: a longer line is
	// relayed in pieces and not searched for usage (usage chunks are
	// small).
	maxStreamLine = 64 << 10
)

// relayStream copies an SSE answer to the client line by line, flushing
// at each event's end, and reports the usage chunk (sent last with
// stream_options.include_usage) when it passes. A client that goes away
// stops the copy; the request's context then cancels the upstream call.
func relayStream(w http.ResponseWriter, body io.Reader, call *middleware.Call) {
	rc := http.NewResponseController(w)
	br := bufio.NewReaderSize(body, maxStreamLine)
	whole := true // the current line started at a line start
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if whole && bytes.HasPrefix(line, []byte("data: ")) && bytes.Contains(line, []byte(`"usage"`)) {
				if u, ok := mockllm.ParseUsage("text/event-stream", line); ok {
					call.Report(middleware.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens})
				}
			}
			if _, werr := w.Write(line); werr != nil {
				return
			}
			if len(line) == 1 && line[0] == '\n' { // the blank line ending an event
				if rc.Flush() != nil {
					return
				}
			}
		}
		whole = err == nil
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			_ = rc.Flush()
			return
		}
	}
}

func openAIError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ}})
}

// Package refgateway is a minimal LLM gateway built on the Sluice SDK, the
// reference for integrators and what the demo and end-to-end tests drive:
// it authenticates a caller's API key to a tenant, asks the flag Checker
// (through the SDK middleware) whether the tenant may call the model — a
// local map lookup, no network call — proxies the request to an
// OpenAI-compatible upstream, and emits one usage event per completed call
// with the usage the upstream reported, streaming included, and one per
// refused call (outcome rejected, zero tokens), so refusals are counted.
package refgateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/gateway/middleware"
	"github.com/sluicehq/sluice/schemas"
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
	check := middleware.New(g.Checker, func(r *http.Request) (string, string, string, bool) {
		info, _ := r.Context().Value(ctxKey{}).(*requestInfo)
		if info == nil {
			return "", "", "", false
		}
		return info.caller.Tenant, info.model, info.caller.APIKeyID, true
	}, middleware.WithEmitter(g.Emitter, g.Name))
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
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, info)))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request) {
	info := r.Context().Value(ctxKey{}).(*requestInfo)
	start := g.Now()
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, g.Upstream+"/v1/chat/completions", bytes.NewReader(info.body))
	if err != nil {
		openAIError(w, http.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.Client.Do(req)
	if err != nil {
		g.emit(info, start, 0, mockllm.Usage{}, schemas.OutcomeError)
		openAIError(w, http.StatusBadGateway, "upstream_error", "upstream unreachable")
		return
	}
	defer resp.Body.Close()
	// Buffer the upstream answer to read its usage; a production gateway
	// would tee a stream instead of holding it.
	out, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	outcome := schemas.OutcomeOK
	if err != nil || resp.StatusCode >= 500 {
		outcome = schemas.OutcomeError
	}
	usage, _ := mockllm.ParseUsage(resp.Header.Get("Content-Type"), out)
	g.emit(info, start, resp.StatusCode, usage, outcome)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

func (g *Gateway) emit(info *requestInfo, start time.Time, status int, u mockllm.Usage, outcome schemas.Outcome) {
	end := g.Now()
	ev := &schemas.UsageEvent{
		ID: newID(), Time: end.UTC(), Tenant: info.caller.Tenant, Model: info.model,
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		APIKeyID: info.caller.APIKeyID, Provider: "mock", Endpoint: "/v1/chat/completions",
		Status: status, Outcome: outcome, LatencyMS: end.Sub(start).Milliseconds(), Gateway: g.Name,
	}
	// A full Emitter buffer is counted and logged by the Emitter itself; the
	// caller's request must not fail because metering is behind.
	_ = g.Emitter.Emit(ev)
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func openAIError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ}})
}

package authz

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/schemas"
)

// Config is the authz service's section of the Sluice configuration
// (services.authz).
type Config struct {
	Listen string `yaml:"listen" help:"address of the forward-auth endpoint (and of /healthz and /readyz)"`
	Name   string `yaml:"name" help:"the gateway field of the usage events of refused checks"`
	Path   string `yaml:"path" help:"path of the forward-auth endpoint; every path below it is answered too (Envoy's ext_authz appends the original path), whatever the method"`

	Headers Headers `yaml:"headers"`

	GRPC GRPC `yaml:"grpc"`

	DefaultPromptTokens     int64 `yaml:"default_prompt_tokens" help:"prompt tokens admission debits for a request that carries no estimate header (forward-auth never sees the body)"`
	DefaultCompletionTokens int64 `yaml:"default_completion_tokens" help:"completion tokens admission debits for a request that carries no estimate header"`
	MaxEstimateTokens       int64 `yaml:"max_estimate_tokens" help:"largest estimate a request's estimate headers may give (each); above it the request is answered 400"`

	// FrontEnd is the HTTP server, shutdown, flags, admission and usage
	// settings authz shares with sluice gateway. Its Usage is where the
	// usage events of refused checks go (outcome rejected, zero tokens, as
	// sluice gateway sends for the requests it refuses); the default sink
	// none sends none.
	frontend.FrontEnd[frontend.EventSink] `yaml:",inline"`
}

// Headers names the request headers the endpoint reads, and the answer
// headers that carry the caller's identity to the upstream.
type Headers struct {
	Key      string `yaml:"key" help:"header with the tenant key, as 'Bearer <key>' or the bare key (with tenant_keys.file)"`
	Tenant   string `yaml:"tenant" help:"header naming the tenant (without tenant_keys.file); with tenant_keys.file the allowed answer carries the key's tenant in it, for the upstream"`
	KeyID    string `yaml:"key_id" help:"header naming the API key id flags and limits may be scoped by (without tenant_keys.file); with tenant_keys.file the allowed answer carries the key's id in it"`
	Model    string `yaml:"model" help:"header naming the model (forward-auth does not read the body); empty or absent: only tenant-wide and key flags apply, and a key limited to some models is refused"`
	User     string `yaml:"user" help:"header naming the end user, for limits scoped by user (a key's own user wins)"`
	Priority string `yaml:"priority" help:"header with the request's priority class; with tenant_keys.file any key may lower its priority, only keys with may_set_priority raise it"`
	URI      string `yaml:"uri" help:"header with the original request's path when the proxy does not append it to the endpoint's path (nginx, Traefik: X-Forwarded-Uri); it is the endpoint limits may be scoped by"`

	EstimatePromptTokens     string `yaml:"estimate_prompt_tokens" help:"header with the prompt tokens to debit (else default_prompt_tokens); set it in the proxy, not from the client"`
	EstimateCompletionTokens string `yaml:"estimate_completion_tokens" help:"header with the completion tokens to debit (else default_completion_tokens)"`
}

// GRPC is the Envoy ext_authz gRPC service (envoy.service.auth.v3.Authorization)
// that answers the same checks as the HTTP endpoint, for Envoy's gRPC mode
// and Istio's CUSTOM authorization (docs/forward-auth.md).
type GRPC struct {
	Listen string `yaml:"listen" help:"address of Envoy's ext_authz gRPC service (envoy.service.auth.v3.Authorization, with the gRPC health service) answering the same checks as the HTTP endpoint; empty: off"`
	// TrustEstimateHeaders: Envoy's gRPC mode without allowed_headers, and
	// Istio always, send the check every header the client sent, so the
	// estimate headers are read from the route's context extensions only.
	TrustEstimateHeaders bool `yaml:"trust_estimate_headers" help:"also read the estimate headers from the request's headers (a route's context_extensions still win); only when the proxy sets or clears them before ext_authz, since Envoy's gRPC mode and Istio pass on what the client sent"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Listen: "127.0.0.1:8091",
		Name:   "sluice-authz",
		Path:   "/authz",
		Headers: Headers{
			Key: "Authorization", Tenant: "X-Sluice-Tenant", KeyID: "X-Sluice-Key-Id", Model: "X-Sluice-Model",
			User: "X-Sluice-User", Priority: "X-Sluice-Priority", URI: "X-Forwarded-Uri",
			EstimatePromptTokens: "X-Sluice-Estimate-Prompt-Tokens", EstimateCompletionTokens: "X-Sluice-Estimate-Completion-Tokens",
		},
		DefaultPromptTokens:     1000,
		DefaultCompletionTokens: 1000,
		MaxEstimateTokens:       10_000_000,
		FrontEnd:                frontend.DefaultFrontEnd(authzUsage()),
	}
}

// authzUsage is sluice gateway's usage defaults with sink none: a refusal
// event needs an ingest (or Kafka) the deployment names, and the endpoint
// answers the same without one.
func authzUsage() frontend.EventSink {
	u := frontend.DefaultEventSink()
	u.Sink = frontend.SinkNone
	return u
}

// Validate checks every field and names the limit it crossed.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen: %q is not host:port", c.Listen)
	}
	if c.GRPC.Listen != "" {
		if _, p, err := net.SplitHostPort(c.GRPC.Listen); err != nil {
			bad("grpc.listen: %q is not host:port (or empty: no gRPC service)", c.GRPC.Listen)
		} else if c.GRPC.Listen == c.Listen && p != "0" {
			bad("grpc.listen: %q is already listen (the HTTP endpoint's): give the gRPC service a port of its own", c.GRPC.Listen)
		}
	}
	if c.Name == "" || len(c.Name) > schemas.MaxStringLen {
		bad("name: must be 1..%d bytes", schemas.MaxStringLen)
	}
	if !strings.HasPrefix(c.Path, "/") || strings.HasSuffix(c.Path, "/") || c.Path == "/healthz" || c.Path == "/readyz" {
		bad("path: %q must start with / and not end with one (e.g. /authz), and must not be /healthz or /readyz", c.Path)
	}
	h := c.Headers
	seen := map[string]string{}
	for _, f := range []struct {
		name, value string
		required    bool
	}{
		{"key", h.Key, false}, {"tenant", h.Tenant, true}, {"key_id", h.KeyID, true}, {"model", h.Model, false},
		{"user", h.User, false}, {"priority", h.Priority, false}, {"uri", h.URI, false},
		{"estimate_prompt_tokens", h.EstimatePromptTokens, false}, {"estimate_completion_tokens", h.EstimateCompletionTokens, false},
	} {
		switch {
		case f.value == "" && f.required:
			bad("headers.%s: is required", f.name)
		case f.value == "":
		case !validHeaderName(f.value):
			bad("headers.%s: %q is not an HTTP header name", f.name, f.value)
		case seen[http.CanonicalHeaderKey(f.value)] != "":
			bad("headers.%s: %q is already headers.%s", f.name, f.value, seen[http.CanonicalHeaderKey(f.value)])
		default:
			seen[http.CanonicalHeaderKey(f.value)] = f.name
		}
	}
	if c.MaxEstimateTokens < 1 || c.MaxEstimateTokens > 1_000_000_000 {
		bad("max_estimate_tokens: %d is outside 1..1000000000", c.MaxEstimateTokens)
	}
	if c.DefaultPromptTokens < 0 || c.DefaultPromptTokens > c.MaxEstimateTokens {
		bad("default_prompt_tokens: %d is outside 0..max_estimate_tokens (%d)", c.DefaultPromptTokens, c.MaxEstimateTokens)
	}
	if c.DefaultCompletionTokens < 0 || c.DefaultCompletionTokens > c.MaxEstimateTokens {
		bad("default_completion_tokens: %d is outside 0..max_estimate_tokens (%d)", c.DefaultCompletionTokens, c.MaxEstimateTokens)
	}
	if err := c.FrontEnd.Validate(""); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

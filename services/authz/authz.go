package authz

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// HeaderError is the answer header that repeats a refusal's OpenAI error
// body as one line of ASCII JSON: nginx's auth_request drops the body of
// the authorization answer, and its configuration returns this instead
// (docs/forward-auth.md).
const HeaderError = "X-Sluice-Error"

// Deps are what a Server decides with; New builds none of them, so tests
// and embedding programs give their own.
type Deps struct {
	// Checker decides from the enforcement flags; nil allows every tenant.
	Checker middleware.Decider
	// Admitter, when not nil, is asked after the flags allowed a request.
	Admitter frontend.Admitter
	// Emitter, when not nil, receives a usage event for each check the
	// flags or admission refuse (outcome rejected, zero tokens), as sluice
	// gateway sends for the requests it refuses; see refusalEvent.
	Emitter middleware.Emitter
	// Keys, when not nil, authenticates the key in Headers.Key; nil takes
	// the tenant from Headers.Tenant (the proxy authenticated the caller).
	Keys *keyfile.File[frontend.Caller]
	// Policy, when not nil, is the policy in force: the tenants' priority
	// classes. Without it a request's class is its key's or normal.
	Policy func() *policy.Policy
	// Logger receives refusals and errors; nil means slog.Default.
	Logger *slog.Logger
	// Metrics receives the service's series; nil registers none.
	Metrics prometheus.Registerer
}

// Server is the forward-auth endpoint's HTTP handler: cfg.Path and every
// path below it answer checks, /healthz and /readyz the probes.
type Server struct {
	cfg     Config
	dec     middleware.Decider
	admit   frontend.Admitter
	em      middleware.Emitter
	keys    *keyfile.File[frontend.Caller]
	policy  func() *policy.Policy // nil: no policy
	log     *slog.Logger
	m       *metrics
	sub     string            // cfg.Path + "/"
	lower   map[string]string // the configured header names in lower case (gRPC checks)
	closing atomic.Bool
	now     func() time.Time
}

// NewServer builds the Server of cfg (which must validate) with deps: the
// handler the service serves, which an embedding host or a test can serve
// itself.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, dec: frontend.OrAllowAll(deps.Checker), admit: deps.Admitter, em: deps.Emitter, keys: deps.Keys, policy: deps.Policy,
		log: cmp.Or(deps.Logger, slog.Default()), m: newMetrics(),
		sub: cfg.Path + "/", lower: lowerNames(cfg.Headers), now: time.Now}
	if deps.Metrics != nil {
		if err := s.m.all.Register(deps.Metrics); err != nil {
			return nil, fmt.Errorf("authz: register metrics: %w", err)
		}
	}
	return s, nil
}

// ServeHTTP answers checks on the endpoint's path (any method, any path
// below it: Envoy appends the original path) and the probes. The path is
// matched as sent, not cleaned, so no check is ever answered a redirect.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == s.cfg.Path || strings.HasPrefix(p, s.sub):
		s.check(w, r)
	case p == "/healthz":
		_, _ = w.Write([]byte("ok\n"))
	case p == "/readyz":
		if s.closing.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	default:
		http.Error(w, fmt.Sprintf("this is Sluice's forward-auth endpoint: send checks to %s", s.cfg.Path), http.StatusNotFound)
	}
}

// Decided-by values of the checks metric and the refusal log.
const (
	byAllowed   = "allowed"
	byFlags     = "flags"
	byAdmission = "admission"
	byKey       = "key"
	byRequest   = "request"
)

// call is what a check knows about the request it decides.
type call struct {
	tenant, keyID, user, model, endpoint string
	priority                             schemas.Priority
	prompt, completion                   int64
}

// refusal is an answer other than 200: an OpenAI error and its status.
type refusal struct {
	status int
	err    ratelimit.Error
	retry  time.Duration
	by     string
}

// Transports a check arrives on: the label of the checks metrics.
const (
	transportHTTP = "http"
	transportGRPC = "grpc"
)

// headerSource is a check's request headers, looked up by the names the
// configuration gives (Headers): http.Header for the HTTP endpoint, Envoy's
// lower-cased header map for the gRPC service.
type headerSource interface {
	Get(name string) string
}

// request is what a front end hands the decision: the headers of the
// request to decide, where its estimate headers are read, and the path
// admission may scope limits by.
type request struct {
	headers headerSource
	// estimates is where the estimate headers are read: the request's
	// headers on the HTTP endpoint (the proxy sets or clears them), the
	// route's context extensions over gRPC (see grpcRequest).
	estimates headerSource
	// endpoint is the original request's path without its query, "" when
	// the front end does not know it.
	endpoint string
}

// verdict is a decided check, for a front end to answer in its own terms.
type verdict struct {
	// status is 200 or the refusal's HTTP status.
	status int
	// header holds a refusal's answer headers (Content-Type, Retry-After,
	// x-ratelimit-*, WWW-Authenticate); nil when allowed.
	header http.Header
	// body is a refusal's OpenAI error body; nil when allowed.
	body []byte
	// limits are the admission rules' numbers of an allowed check, for
	// its x-ratelimit-* headers.
	limits []ratelimit.Limit
	// call is who called, for the headers an allowed check adds upstream.
	call call
}

// allowed reports whether the check lets the request through.
func (v *verdict) allowed() bool { return v.status == http.StatusOK }

// decide is the one decision both front ends answer with: who calls (key
// or headers), the flags, then admission; it emits the refusal's usage
// event, counts the check under transport and logs refusals.
func (s *Server) decide(ctx context.Context, req request, transport string) verdict {
	start := s.now()
	c, ref := s.identify(req)
	if ref != nil {
		cw := newCapture()
		if ref.status == http.StatusUnauthorized {
			cw.h.Set("WWW-Authenticate", `Bearer realm="sluice"`)
		}
		ratelimit.WriteError(cw, ref.status, ref.err, ref.retry)
		return s.deny(ctx, cw, &c, ref.by, transport, start)
	}
	if d := s.dec.Check(c.tenant, c.model, c.keyID); !d.Allowed() {
		cw := newCapture()
		middleware.Refuse(cw, d, c.tenant, c.model, start)
		if f := d.Flag; f != nil {
			// The flag's reason is the operator's note: logs only.
			s.log.LogAttrs(ctx, slog.LevelInfo, "flag refused a request", slog.String("tenant", c.tenant),
				slog.String("model", c.model), slog.String("api_key_id", c.keyID), slog.String("kind", string(f.Kind)),
				slog.String("quota", f.Quota), slog.String("reason", f.Reason), slog.String("transport", transport))
		}
		if s.em != nil {
			s.emit(middleware.RefusalEvent(d, c.tenant, c.model, c.keyID, c.endpoint, s.cfg.Name, start), &c)
		}
		return s.deny(ctx, cw, &c, byFlags, transport, start)
	}
	var limits []ratelimit.Limit
	if s.admit != nil {
		adm := s.admit.Admit(ctx, frontend.AdmitRequest{Tenant: c.tenant, Model: c.model, User: c.user, APIKeyID: c.keyID,
			Endpoint: c.endpoint, Priority: c.priority, EstimatePrompt: c.prompt, EstimateCompletion: c.completion, Estimated: true})
		// adm.Settle is deliberately never called: the answer's tokens
		// never pass here, so the estimate stands (see the package doc).
		if f := adm.Refused; f != nil {
			cw := newCapture()
			for _, l := range adm.Limits {
				ratelimit.SetHeaders(cw.h, l)
			}
			st := f.Status
			if st < 400 || st > 599 {
				st = http.StatusTooManyRequests
			}
			ratelimit.WriteError(cw, st, f.Error, f.RetryAfter)
			if s.em != nil && st != http.StatusBadRequest { // 400: a request admission could not judge, not a refusal
				ev := middleware.AdmissionRefusalEvent(schemas.UsageEvent{Tenant: c.tenant, Model: c.model, APIKeyID: c.keyID,
					Endpoint: c.endpoint, Gateway: s.cfg.Name}, f.Rule, st, start)
				s.emit(&ev, &c)
			}
			return s.deny(ctx, cw, &c, byAdmission, transport, start)
		}
		limits = adm.Limits
	}
	s.m.observe(transport, http.StatusOK, byAllowed, s.now().Sub(start))
	return verdict{status: http.StatusOK, limits: limits, call: c}
}

// check is the HTTP front end: it answers the verdict with its status,
// headers and body, the body repeated in HeaderError.
func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	endpoint := strings.TrimPrefix(r.URL.Path, s.cfg.Path)
	if endpoint == "" {
		endpoint, _, _ = strings.Cut(headerValue(r.Header, s.cfg.Headers.URI), "?")
	}
	v := s.decide(r.Context(), request{headers: r.Header, estimates: r.Header, endpoint: endpoint}, transportHTTP)
	h := w.Header()
	if !v.allowed() {
		for k, vals := range v.header {
			h[k] = vals
		}
		h.Set(HeaderError, asciiJSON(bytes.TrimSpace(v.body)))
		w.WriteHeader(v.status)
		_, _ = w.Write(v.body)
		return
	}
	for _, l := range v.limits {
		ratelimit.SetHeaders(h, l)
	}
	h.Set(s.cfg.Headers.Tenant, v.call.tenant)
	if v.call.keyID != "" {
		h.Set(s.cfg.Headers.KeyID, v.call.keyID)
	}
	w.WriteHeader(http.StatusOK)
}

// emit sends the usage event of a refused check, with the caller's user
// and priority (as sluice gateway's events carry them). Emit never blocks:
// a full buffer drops the event and the Emitter counts it.
func (s *Server) emit(ev *schemas.UsageEvent, c *call) {
	ev.User, ev.Priority = c.user, c.priority
	_ = s.em.Emit(ev)
}

// deny turns the refusal written into cw into a verdict, and records it.
func (s *Server) deny(ctx context.Context, cw *capture, c *call, by, transport string, start time.Time) verdict {
	v := verdict{status: cw.status, header: cw.h, body: cw.body.Bytes(), call: *c}
	s.m.observe(transport, v.status, by, s.now().Sub(start))
	if by != byFlags {
		s.log.LogAttrs(ctx, slog.LevelInfo, "refused a request", slog.String("tenant", c.tenant),
			slog.String("model", c.model), slog.String("api_key_id", c.keyID), slog.Int("status", v.status),
			slog.String("by", by), slog.String("transport", transport), slog.String("error", string(bytes.TrimSpace(v.body))))
	}
	return v
}

// identify reads who calls which model from the request's headers, and
// what admission debits.
func (s *Server) identify(req request) (call, *refusal) {
	hn := s.cfg.Headers
	hs := req.headers
	var c call
	var caller *frontend.Caller
	if s.keys != nil {
		key := strings.TrimSpace(hs.Get(hn.Key))
		if len(key) > 7 && strings.EqualFold(key[:7], "bearer ") {
			key = strings.TrimSpace(key[7:])
		}
		if caller = s.keys.Authenticate(key); caller == nil {
			return c, &refusal{status: http.StatusUnauthorized, by: byKey, err: ratelimit.Error{Type: "invalid_request_error", Code: "invalid_api_key",
				Message: fmt.Sprintf("Incorrect API key provided. Send a Sluice gateway key as %s: Bearer <key>.", hn.Key)}}
		}
		c.tenant, c.keyID, c.user, c.priority = caller.Tenant, caller.KeyID, caller.User, caller.Priority
	} else {
		c.tenant, c.keyID = hs.Get(hn.Tenant), hs.Get(hn.KeyID)
		if c.tenant == "" {
			return c, &refusal{status: http.StatusUnauthorized, by: byKey, err: ratelimit.Error{Type: "invalid_request_error", Code: "missing_tenant",
				Message: fmt.Sprintf("The request names no tenant in %s; the proxy in front of Sluice sets it once it has authenticated the caller.", hn.Tenant)}}
		}
	}
	if hn.Model != "" {
		c.model = hs.Get(hn.Model)
	}
	if c.user == "" && hn.User != "" {
		c.user = hs.Get(hn.User)
	}
	if ref := s.checkFields(&c); ref != nil {
		return c, ref
	}
	if caller != nil && !caller.MayUse(c.model) {
		msg := fmt.Sprintf("The API key %s may not use the model `%s`.", caller.KeyID, c.model)
		if c.model == "" {
			msg = fmt.Sprintf("The API key %s may use only some models; name the model in %s.", caller.KeyID, hn.Model)
		}
		param := "model"
		return c, &refusal{status: http.StatusForbidden, by: byKey, err: ratelimit.Error{Type: "invalid_request_error", Code: "model_not_allowed", Message: msg, Param: &param}}
	}
	if asked := headerValue(hs, hn.Priority); caller != nil || asked != "" {
		var tenantClass schemas.Priority
		if s.policy != nil {
			tenantClass = s.policy().Tenant(c.tenant).Class()
		}
		p, err := caller.PriorityOf(tenantClass, asked)
		switch {
		case errors.Is(err, priority.ErrRaiseNotAllowed):
			return c, &refusal{status: http.StatusForbidden, by: byKey, err: ratelimit.Error{Type: "permission_denied", Code: "priority_not_allowed",
				Message: fmt.Sprintf("%v. The API key %s may only lower its priority; ask for may_set_priority in the gateway's keys file.", err, caller.KeyID)}}
		case err != nil:
			return c, badRequest("invalid_priority", err.Error()+".")
		}
		c.priority = p
	}
	c.endpoint = req.endpoint
	if len(c.endpoint) > schemas.MaxStringLen {
		c.endpoint = c.endpoint[:schemas.MaxStringLen]
	}
	var ref *refusal
	if c.prompt, ref = s.estimate(req.estimates, hn.EstimatePromptTokens, s.cfg.DefaultPromptTokens); ref != nil {
		return c, ref
	}
	c.completion, ref = s.estimate(req.estimates, hn.EstimateCompletionTokens, s.cfg.DefaultCompletionTokens)
	return c, ref
}

// checkFields applies the usage event's bounds to what the headers named,
// naming the header of a value out of bounds.
func (s *Server) checkFields(c *call) *refusal {
	probe := schemas.UsageEvent{Tenant: c.tenant, Model: c.model, APIKeyID: c.keyID, User: c.user}
	if probe.Model == "" {
		probe.Model = "unknown"
	}
	var errs schemas.ValidationError
	probe.ValidateFields(&errs, "", ^(schemas.FieldTenant | schemas.FieldModel | schemas.FieldAPIKeyID | schemas.FieldUser))
	if len(errs) == 0 {
		return nil
	}
	hn := s.cfg.Headers
	names := map[string]string{"tenant": hn.Tenant, "model": hn.Model, "api_key_id": hn.KeyID, "user": hn.User}
	msgs := make([]string, 0, len(errs))
	for _, fe := range errs {
		msgs = append(msgs, names[fe.Field]+": "+fe.Reason)
	}
	return badRequest("invalid_header", strings.Join(msgs, "; "))
}

// estimate reads the tokens header name gives, def when it is absent.
func (s *Server) estimate(hs headerSource, name string, def int64) (int64, *refusal) {
	v := headerValue(hs, name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > s.cfg.MaxEstimateTokens {
		return 0, badRequest("invalid_estimate", fmt.Sprintf("%s: %q is not a whole number of tokens from 0 to %d (services.authz.max_estimate_tokens).",
			name, v, s.cfg.MaxEstimateTokens))
	}
	return n, nil
}

// headerValue is the header name gives, "" when the setting is empty.
func headerValue(hs headerSource, name string) string {
	if name == "" {
		return ""
	}
	return hs.Get(name)
}

func badRequest(code, msg string) *refusal {
	return &refusal{status: http.StatusBadRequest, by: byRequest, err: ratelimit.Error{Type: "invalid_request_error", Code: code, Message: msg}}
}

// capture holds an answer written by the SDK's writers (middleware.Refuse,
// ratelimit.WriteError), so its body can also go into HeaderError.
type capture struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func newCapture() *capture { return &capture{h: http.Header{}} }

func (c *capture) Header() http.Header { return c.h }

func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(b)
}

// asciiJSON returns a JSON document with every non-ASCII character
// escaped (\uXXXX, surrogate pairs above the BMP), so it can travel as a
// header value; control characters are already escaped by encoding/json.
func asciiJSON(b []byte) string {
	var out strings.Builder
	out.Grow(len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r < utf8.RuneSelf:
			out.WriteByte(b[0])
		case r > 0xFFFF:
			r -= 0x10000
			fmt.Fprintf(&out, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
		default:
			fmt.Fprintf(&out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out.String()
}

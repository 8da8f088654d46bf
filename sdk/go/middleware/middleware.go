// Package middleware is net/http middleware that enforces Sluice flags on
// every request with a Checker: it answers 429 when a quota or rate window
// is exhausted (Retry-After = time to the period boundary or the end of the
// window), 403 for a blacklist, 503 for open breakers and for a stale view
// of a tenant that fails closed, each with an OpenAI-compatible JSON error
// body that names the limit, and OpenAI's x-ratelimit-* headers where the
// numbers are known (package ratelimit holds the formats).
//
// The body never carries the flag's Reason: that is the operator's internal
// note (a fraud case, an incident number, who asked for the block) and end
// users must not read it. What they see is derived from the flag's kind,
// quota, period, numbers and retry time only. WithLogger (or WithRefused)
// gives the gateway's own logs the internal reason.
//
// Given an Emitter (WithEmitter), it also emits a usage event for every
// request it refuses: outcome "rejected", zero tokens, the status it
// answered. Without them refusals are invisible to Sluice (no counts, no
// reports, no alert can say how many callers a breaker turned away). The
// aggregator keeps such events out of token quotas, requests_per_minute and
// the error and slow-call ratios, so they never extend the refusal itself.
//
// With WithEstimates it also meters the requests it lets through: an
// estimate of the body (package estimate) is emitted before the handler
// runs and settled with the usage the handler reports (CallFrom(ctx).Report)
// when it returns, two events with one id, each exactly once — see
// WithEstimates for what a settlement carries on errors, cancellations,
// panics and streams.
//
// The gateway's Identify function says who calls, as an Identity: the
// tenant, the model and the API key id, and where the gateway knows them
// the end user and the priority class. The flags are checked for the
// tenant, model and key; admission (WithAdmission) judges the request
// with all five, so rules scoped to users and reserves kept for high and
// critical requests apply; and the usage events carry the same user and
// priority.
package middleware

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// Decider is what the middleware asks; *checker.Checker is the real one.
type Decider interface {
	Check(tenant, model, apiKeyID string) checker.Decision
}

// Identity is who calls which model, as the gateway's Identify function
// tells the middleware after authenticating the request.
type Identity struct {
	// Tenant is the caller's tenant, whose flags and limits apply.
	Tenant string
	// Model is the model asked for; empty takes the body's (WithEstimates).
	Model string
	// APIKeyID identifies the caller's API key (an id, never the key).
	APIKeyID string
	// User is the tenant's end user when the gateway knows one (OpenAI's
	// user, a header the gateway trusts): admission's user-scoped rules
	// count it, and the usage events carry it. It must fit the event's
	// limits (schemas.MaxStringLen). Empty: no user, and rules scoped to
	// users do not apply.
	User string
	// Priority is the request's class (the tenant's or key's, as the
	// gateway decides): admission opens a rule's reserve (admission.Rule's
	// Reserve) to high and critical requests only, a Guard orders its
	// queue by it unless the GuardFunc gives another, and the usage events
	// carry it. Empty, or a name that is no class, is normal and leaves
	// the events' priority empty.
	Priority schemas.Priority
}

// priority is id's class, or empty when it names none.
func (id Identity) priority() schemas.Priority {
	if id.Priority.Valid() {
		return id.Priority
	}
	return ""
}

// Identify extracts who is calling which model. ok false lets the request
// through unchecked (for example a health probe).
type Identify func(r *http.Request) (id Identity, ok bool)

// IdentityHeaders names the request headers an Identify function reads,
// for gateways whose authentication sets them. A client must not be able
// to set them itself: the gateway removes what the client sent and writes
// its own. An empty name is not read.
type IdentityHeaders struct {
	Tenant, Model, Key, User, Priority string
}

// Identify returns the Identify function that reads h. A request without
// the tenant header passes unchecked; a priority header that names no
// class (schemas.ParsePriority) counts as none.
func (h IdentityHeaders) Identify() Identify {
	get := func(r *http.Request, name string) string {
		if name == "" {
			return ""
		}
		return r.Header.Get(name)
	}
	return func(r *http.Request) (Identity, bool) {
		id := Identity{Tenant: get(r, h.Tenant), Model: get(r, h.Model), APIKeyID: get(r, h.Key), User: get(r, h.User)}
		if v := get(r, h.Priority); v != "" {
			id.Priority, _ = schemas.ParsePriority(v)
		}
		return id, id.Tenant != ""
	}
}

// HeaderIdentify reads the tenant, model and API key id from request
// headers, for gateways that set them after authentication; IdentityHeaders
// reads the user and priority too.
func HeaderIdentify(tenantHeader, modelHeader, keyHeader string) Identify {
	return IdentityHeaders{Tenant: tenantHeader, Model: modelHeader, Key: keyHeader}.Identify()
}

// Option adjusts the middleware.
type Option func(*mw)

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(m *mw) { m.now = now } }

// WithRefused is called for every refused request, for logging or metrics.
func WithRefused(f func(r *http.Request, d checker.Decision)) Option {
	return func(m *mw) { m.refused = f }
}

// WithLogger logs every refused request on l at Info with the tenant,
// model, breaker kind, state and the flag's internal Reason, which the
// response body never shows. A gateway refusing many requests a second
// should give a logger with a higher level or sample through WithRefused.
func WithLogger(l *slog.Logger) Option { return func(m *mw) { m.log = l } }

// Emitter is the part of the SDK's emitter.Emitter the middleware uses.
type Emitter interface {
	Emit(ev *schemas.UsageEvent) error
}

// WithEmitter makes the middleware emit a usage event through e for every
// request it refuses (outcome rejected, zero tokens, Status the code it
// answered, Gateway = gateway, attribute refused_by = the breaker kind or
// "fail_closed"). It is on as soon as an Emitter is given;
// WithRefusalEvents(false) turns it off. Emit never blocks; a full buffer
// drops the event and the Emitter counts it.
func WithEmitter(e Emitter, gateway string) Option {
	return func(m *mw) { m.emitter, m.gateway, m.emitRefusals = e, gateway, true }
}

// WithRefusalEvents turns the events WithEmitter sends for refused
// requests on or off, whatever the order of the options.
func WithRefusalEvents(on bool) Option {
	return func(m *mw) { m.refusalEvents = &on }
}

type mw struct {
	d       Decider
	id      Identify
	now     func() time.Time
	refused func(*http.Request, checker.Decision)
	log     *slog.Logger

	emitter       Emitter
	gateway       string
	emitRefusals  bool
	refusalEvents *bool // set by WithRefusalEvents; overrides the default

	est              *estimate.Estimator               // WithEstimates: meter allowed requests
	adm              *admission.Limiter                // WithAdmission: check limits before the call
	cost             func(model string, u Usage) int64 // WithCost: prices calls for cost rules
	noEstimateEvents bool                              // WithEstimateEvents(false)

	fields func(r *http.Request, ev *schemas.UsageEvent) // WithEventFields
	guard  GuardFunc                                     // WithGuard
	tracer trace.Tracer                                  // WithTracing; nil: off
}

// WithEventFields lets the gateway fill in what it knows about a request
// that the middleware does not: f is called with every event's common
// part before it is emitted — the estimate and the settlement of a
// metered call (once, before the estimate, so both carry the same
// fields), and each refusal event. It may set ID, User, Priority,
// SessionID, Provider and Attributes; the tenant, model, key, endpoint,
// gateway, times, tokens, status and outcome are the middleware's, and so
// are the user and priority when the Identity gives them (admission
// counts the same ones: the Identity's, else what f set). An ID
// it sets becomes the metered call's id (Call.ID) and must be a valid
// event id, unique per call: a repeated id is deduplicated by Sluice,
// so the later call would go uncounted. Refusal events keep their own
// fresh id for that reason. Attributes it sets are not changed
// afterwards; the settlement adds its own to a copy.
func WithEventFields(f func(r *http.Request, ev *schemas.UsageEvent)) Option {
	return func(m *mw) { m.fields = f }
}

// New returns middleware that checks each request with d.
func New(d Decider, id Identify, opts ...Option) func(http.Handler) http.Handler {
	m := &mw{d: d, id: id, now: time.Now}
	for _, o := range opts {
		o(m)
	}
	if m.refusalEvents != nil {
		m.emitRefusals = *m.refusalEvents
	}
	m.emitRefusals = m.emitRefusals && m.emitter != nil // WithEmitter(nil, …) emits nothing
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, ok := m.id(r)
			if !ok {
				next.ServeHTTP(w, r)
				return
			}
			tenant, model, key := id.Tenant, id.Model, id.APIKeyID
			d := m.d.Check(tenant, model, key)
			if d.Allowed() {
				if m.est != nil {
					m.meter(w, r, next, id, probeKind(d))
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			if m.refused != nil {
				m.refused(r, d)
			}
			if m.log != nil {
				logRefusal(m.log, r, d, tenant, model, key)
			}
			now := m.now()
			if m.emitRefusals {
				ev := RefusalEvent(d, tenant, model, key, r.URL.Path, m.gateway, now)
				ev.User, ev.Priority = id.User, id.priority()
				if m.fields != nil {
					id := ev.ID
					m.applyFields(r, ev)
					ev.ID = id
					ev.Attributes = withRefusedBy(ev.Attributes, d)
				}
				_ = m.emitter.Emit(ev)
			}
			Refuse(w, d, tenant, model, now)
		})
	}
}

func logRefusal(l *slog.Logger, r *http.Request, d checker.Decision, tenant, model, key string) {
	if d.Flag == nil {
		l.LogAttrs(r.Context(), slog.LevelInfo, "sluice refused a request: tenant fails closed on a stale view",
			slog.String("tenant", tenant), slog.String("model", model), slog.String("api_key_id", key))
		return
	}
	f := d.Flag
	l.LogAttrs(r.Context(), slog.LevelInfo, "sluice refused a request",
		slog.String("tenant", tenant), slog.String("model", model), slog.String("api_key_id", key),
		slog.String("scope", d.Scope), slog.String("kind", string(f.Kind)), slog.String("state", string(f.State)),
		slog.String("quota", f.Quota), slog.String("reason", f.Reason))
}

// RefusalEvent is the usage event for a request refused with d: outcome
// rejected, zero tokens, Status what Refuse answers. Gateways that refuse
// without the middleware (or in another language) send the same. A model
// the caller left out becomes "unknown", because an event needs one; an
// endpoint longer than the schema allows is cut.
func RefusalEvent(d checker.Decision, tenant, model, apiKeyID, endpoint, gateway string, now time.Time) *schemas.UsageEvent {
	if model == "" {
		model = "unknown"
	}
	if len(endpoint) > schemas.MaxStringLen {
		endpoint = endpoint[:schemas.MaxStringLen]
	}
	by := "fail_closed"
	if d.Flag != nil {
		by = string(d.Flag.Kind)
	}
	return &schemas.UsageEvent{
		ID: "rej-" + newID(), Time: now.UTC(), Tenant: tenant, Model: model, APIKeyID: apiKeyID,
		Endpoint: endpoint, Gateway: gateway, Status: Status(d), Outcome: schemas.OutcomeRejected,
		Attributes: map[string]string{"refused_by": by},
	}
}

// applyFields lets WithEventFields' function fill ev, then restores the
// fields that are the middleware's own.
func (m *mw) applyFields(r *http.Request, ev *schemas.UsageEvent) {
	own := *ev
	m.fields(r, ev)
	ev.Time, ev.Tenant, ev.Model, ev.APIKeyID, ev.Endpoint, ev.Gateway = own.Time, own.Tenant, own.Model, own.APIKeyID, own.Endpoint, own.Gateway
	if own.User != "" {
		ev.User = own.User
	}
	if own.Priority != "" {
		ev.Priority = own.Priority
	}
	ev.PromptTokens, ev.CompletionTokens, ev.CachedTokens = own.PromptTokens, own.CompletionTokens, own.CachedTokens
	ev.CacheWriteTokens, ev.ReasoningTokens = own.CacheWriteTokens, own.ReasoningTokens
	ev.Status, ev.Outcome, ev.LatencyMS, ev.Estimated = own.Status, own.Outcome, own.LatencyMS, own.Estimated
}

// withRefusedBy returns attrs (copied) with the refusal's refused_by
// attribute, for a refusal event whose attributes WithEventFields set.
func withRefusedBy(attrs map[string]string, d checker.Decision) map[string]string {
	out := make(map[string]string, len(attrs)+1)
	for k, v := range attrs {
		out[k] = v
	}
	out["refused_by"] = "fail_closed"
	if d.Flag != nil {
		out["refused_by"] = string(d.Flag.Kind)
	}
	return out
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ErrorBody is the OpenAI-compatible error response Refuse writes, with a
// "sluice" member carrying the numbers for clients that want them; it is
// the type to decode it with (ratelimit.Body writes it).
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the "error" member of ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	Sluice  *Detail `json:"sluice,omitempty"`
}

// Detail says exactly which limit refused the request.
type Detail struct {
	Kind              string     `json:"kind"`
	State             string     `json:"state,omitempty"`
	Scope             string     `json:"scope,omitempty"`
	Quota             string     `json:"quota,omitempty"`
	Period            string     `json:"period,omitempty"`
	Used              float64    `json:"used,omitempty"`
	Limit             float64    `json:"limit,omitempty"`
	ResetsAt          *time.Time `json:"resets_at,omitempty"`
	RetryAfterSeconds int64      `json:"retry_after_seconds,omitempty"`
	// There is deliberately no reason here: the flag's Reason is the
	// operator's internal note and stays in the gateway's logs.
}

// Status returns the HTTP status for a refusal.
func Status(d checker.Decision) int {
	if d.Outcome == checker.RefusedStale || d.Flag == nil {
		return http.StatusServiceUnavailable
	}
	switch d.Flag.Kind {
	case flags.KindQuota, flags.KindRate:
		return http.StatusTooManyRequests
	case flags.KindBlacklist:
		return http.StatusForbidden
	}
	return http.StatusServiceUnavailable
}

// Refuse writes the refusal for d in OpenAI's format (package
// ratelimit): Retry-After in whole seconds for 429 and 503, an OpenAI
// error body, and for a quota or rate flag with known numbers the
// x-ratelimit-limit/remaining/reset trio of its unit (tokens or requests;
// none for a budget), the reset a duration such as "6m0s". A quota that
// is spent answers type and code "insufficient_quota", a rate window
// type "tokens" or "requests" and code "rate_limit_exceeded", as OpenAI
// does; the quota's name is in the message and in the "sluice" member.
func Refuse(w http.ResponseWriter, d checker.Decision, tenant, model string, now time.Time) {
	status := Status(d)
	e := ratelimit.Error{Type: "service_unavailable", Code: "sluice_unavailable"}
	retry := d.RetryAfter(now)
	if d.Flag == nil {
		e.Message = fmt.Sprintf("usage limits for tenant %s cannot be verified right now and this tenant fails closed; retry later", tenant)
		retry = 5 * time.Second
	} else {
		f := d.Flag
		det := &Detail{Kind: string(f.Kind), State: string(f.State), Scope: d.Scope, Quota: f.Quota, Period: f.Period,
			Used: f.Used, Limit: f.Limit}
		if !f.ResetsAt.IsZero() {
			t := f.ResetsAt.UTC()
			det.ResetsAt = &t
		}
		if retry > 0 && status != http.StatusForbidden {
			det.RetryAfterSeconds = ratelimit.RetryAfter(retry)
		}
		e.Sluice = det
		e.Message = message(d, tenant, model, retry)
		unit := quotaUnit(f.Quota)
		switch f.Kind {
		case flags.KindQuota:
			e.Type, e.Code = ratelimit.CodeInsufficientQuota, ratelimit.CodeInsufficientQuota
		case flags.KindRate:
			e.Type, e.Code = ratelimit.TypeTokens, ratelimit.CodeRateLimitExceeded
			if unit == ratelimit.Requests {
				e.Type = ratelimit.TypeRequests
			}
		case flags.KindBlacklist:
			e.Type, e.Code = "permission_denied", "blacklisted"
		default:
			e.Code = "breaker_" + string(f.Kind)
		}
		if unit != 0 && f.Limit > 0 && (f.Kind == flags.KindQuota || f.Kind == flags.KindRate) {
			reset := retry
			if !f.ResetsAt.IsZero() {
				reset = f.ResetsAt.Sub(now)
			}
			ratelimit.SetHeaders(w.Header(), ratelimit.Limit{Unit: unit, Limit: int64(math.Ceil(f.Limit)),
				Remaining: int64(math.Max(0, math.Floor(f.Limit-f.Used))), Reset: reset})
		}
	}
	if status == http.StatusForbidden {
		retry = 0 // a blacklist does not lift by waiting
	}
	ratelimit.WriteError(w, status, e, retry)
}

// quotaUnit is the unit of OpenAI's header trio a quota counts in; 0 for
// a budget (money), which has no such header.
func quotaUnit(quota string) ratelimit.Unit {
	switch {
	case quota == string(schemas.QuotaRequestsPerMinute):
		return ratelimit.Requests
	case strings.HasSuffix(quota, "_tokens"), quota == string(schemas.QuotaTokensPerMinute):
		return ratelimit.Tokens
	}
	return 0
}

func message(d checker.Decision, tenant, model string, retry time.Duration) string {
	f := d.Flag
	on := "all models"
	if d.Scope != "" && d.Scope != flags.AllModels {
		on = d.Scope
		if len(on) > len(flags.KeyFieldPrefix) && on[:len(flags.KeyFieldPrefix)] == flags.KeyFieldPrefix {
			on = "API key " + on[len(flags.KeyFieldPrefix):]
		} else {
			on = "model " + on
		}
	}
	switch f.Kind {
	case flags.KindQuota, flags.KindRate:
		s := fmt.Sprintf("Tenant %s has reached its %s limit on %s", tenant, f.Quota, on)
		if f.Limit > 0 || f.Used > 0 {
			// The flag's used is the count when the enforcer wrote it (the
			// crossing); calls in flight then add to it.
			s += fmt.Sprintf(": used at least %s of %s", num(f.Used), num(f.Limit))
		}
		if f.Period != "" {
			s += " this " + f.Period
		}
		if !f.ResetsAt.IsZero() {
			s += fmt.Sprintf("; it resets at %s", f.ResetsAt.UTC().Format(time.RFC3339))
		}
		if retry > 0 {
			s += fmt.Sprintf(" (retry after %ds)", int64(math.Ceil(retry.Seconds())))
		}
		return s + "."
	case flags.KindBlacklist:
		return fmt.Sprintf("Tenant %s is blocked on %s; contact the operator of this service.", tenant, on)
	}
	s := fmt.Sprintf("Requests of tenant %s to %s are paused: %s", tenant, on, breakerText(f.Kind))
	if retry > 0 {
		s += fmt.Sprintf("; retry after %ds", int64(math.Ceil(retry.Seconds())))
	}
	return s + "."
}

// breakerText is the public description of a breaker kind. It is fixed
// text on purpose: the flag's Reason may hold internal detail.
func breakerText(k flags.Kind) string {
	switch k {
	case flags.KindErrorRatio:
		return "too many upstream calls are failing"
	case flags.KindSlowCall:
		return "too many upstream calls are slow"
	case flags.KindManual:
		return "an operator has paused them"
	}
	return "a breaker is open"
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

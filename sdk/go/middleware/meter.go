package middleware

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// WithEstimates makes the middleware meter every request it lets through
// to an OpenAI endpoint (chat completions, completions, embeddings,
// responses; other paths pass unmetered) with an estimate and its
// settlement, two usage events with one id:
//
//   - before the handler runs, the estimate (estimated true): est's
//     estimate of the body, so that Sluice's counters see the tokens while
//     the call is still running and concurrent requests cannot all pass
//     under a quota that only one of them fits;
//   - after the handler returns — on success, on an error answer, when the
//     client went away, when the handler panicked, and for a streamed
//     answer at its end, since the handler returns then — the settlement
//     (estimated false) with the usage the handler reported through
//     CallFrom(ctx).Report, which replaces the estimate in every counter.
//
// Each is emitted exactly once. The settlement's tokens are the reported
// usage; without a report, the estimate when the handler answered 2xx (the
// call presumably ran and was billed; attribute usage=estimate) and zero
// otherwise (a refund; attribute usage=none). Its status is the one the
// handler wrote; its outcome ok below 500, error from 500 or on a panic
// (status 500 if none was written), timeout when the request's deadline
// passed (504 if none was written). When the client went away before the
// handler reported usage, the outcome is empty (the upstream did not
// fail, so no error-ratio breaker counts it), the status 499 if none was
// written, and attribute cancelled=client. A request a half-open flag let
// through as a probe (checker.Probe) carries attribute
// flags.ProbeAttribute (breaker_probe) with the flag's kind, by which the
// aggregator judges the half-open breaker. Reported usage of a successful
// answer teaches est the tenant × model completion ratio
// (Estimator.Observe).
//
// The body is read up to est's MaxBodyBytes and handed on unchanged; a
// longer one is answered 413 before the handler runs. A body that is not
// valid JSON gets no estimate event, only the settlement.
//
// Events need WithEmitter; without it the estimate is still made and
// available to the handler (CallFrom). WithEstimateEvents(false) keeps the
// settlement and drops the estimate event. A nil est turns metering off.
func WithEstimates(est *estimate.Estimator) Option { return func(m *mw) { m.est = est } }

// WithAdmission checks every metered request (WithEstimates is required:
// the estimate is what admission debits) with l before the handler runs,
// after the flags: a request the flags refuse costs no Redis call. The
// request admission judges carries the Identity's user and priority (or,
// when the Identity leaves them empty, those WithEventFields sets), so
// rules scoped to users and reserves open to high and critical requests
// apply. An estimate near the largest count (a max_tokens of 2^63-1) is
// debited as such, and refused by any limit. A
// refused request is answered by admission.WriteRefusal (429 or 503 with
// Retry-After and an OpenAI-style body naming the rule) and emitted as a
// refusal event; an admitted one carries OpenAI's x-ratelimit-* headers
// and its ticket is settled with the settlement's tokens when the handler
// returns, exactly once. Admission runs through Limiter.Acquire: a request
// refused by a rule that lets its class wait (admission.Rule.Wait) waits,
// at most until the request's context ends, for the rule to admit it. A
// nil l turns admission off.
func WithAdmission(l *admission.Limiter) Option { return func(m *mw) { m.adm = l } }

// WithCost prices each metered call for the admission rules that count
// cost (admission.Cost: millionths of the price table's currency): its
// worst case from the estimate (prompt and max_tokens) before the call,
// what the settlement's usage cost after it, each for the model that
// served. Without it a rule counting cost debits the least amount, 1,
// per call — set it whenever the policy has money limits.
func WithCost(f func(model string, u Usage) int64) Option { return func(m *mw) { m.cost = f } }

// costOf is what u of model costs by WithCost, 0 without it.
func (m *mw) costOf(model string, u Usage) int64 {
	if m.cost == nil {
		return 0
	}
	return m.cost(model, u)
}

// WithEstimateEvents turns the estimate event WithEstimates sends before
// each call on or off (default on); the settlement is sent either way.
func WithEstimateEvents(on bool) Option { return func(m *mw) { m.noEstimateEvents = !on } }

// Usage is what the provider reported for a call.
type Usage struct {
	// PromptTokens counts every input token billed: CachedTokens (read
	// from the prompt cache) and CacheWriteTokens (written to it) are
	// parts of it, as in the usage event.
	PromptTokens, CompletionTokens, CachedTokens, CacheWriteTokens int64
	// ReasoningTokens is the part of CompletionTokens the model spent
	// reasoning, where the provider reports it (the event's
	// reasoning_tokens).
	ReasoningTokens int64
	// Counted marks tokens the gateway counted itself because the provider
	// reported none (a stream without a usage chunk, a provider without
	// usage): the settlement carries attribute usage=counted. The event's
	// Estimated field is not used for this: it marks a pre-debit that a
	// later event settles, and a settlement marked so would be dropped as
	// a duplicate of its own estimate.
	Counted bool
}

// Call is one metered request, in its context while the handler runs.
type Call struct {
	id     string
	est    estimate.Estimate
	estErr error
	start  time.Time
	probe  string // the half-open flag's kind when the call is a probe

	mu       sync.Mutex
	usage    Usage
	reported bool
	provider string
	served   string
	outcome  schemas.Outcome
	attrs    map[string]string

	// settled is the settlement once emitted, for the call's span
	// (WithTracing); nil for a call refused before it ran.
	settled *schemas.UsageEvent
}

type callKey struct{}

// CallFrom returns the metered call of ctx, or nil when the middleware
// does not meter this request (no WithEstimates, a refused or unchecked
// request, a path that is not an OpenAI endpoint).
func CallFrom(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}

// ID is the usage event id shared by the estimate and the settlement.
func (c *Call) ID() string { return c.id }

// Estimate returns the request's estimate; ok is false when the body could
// not be parsed (then no estimate event was sent).
func (c *Call) Estimate() (est estimate.Estimate, ok bool) { return c.est, c.estErr == nil }

// Report records the usage the provider reported; the settlement carries
// it. Call it once the usage is known — for a stream, when its last chunk
// arrived; for a call cut short, with what was used so far if known. The
// last report wins. Safe from any goroutine until the handler returns.
func (c *Call) Report(u Usage) {
	c.mu.Lock()
	c.usage, c.reported = u, true
	c.mu.Unlock()
}

// SetProvider sets the settlement's provider field (the upstream that
// served the call).
func (c *Call) SetProvider(p string) {
	c.mu.Lock()
	c.provider = p
	c.mu.Unlock()
}

// SetServedModel records that model, not the one the request asked for,
// served it (a cheaper fallback): the settlement's model is model, which
// every counter and cost report counts and prices, and its
// requested_model the model asked for. The estimate event, sent before
// the call, keeps the asked model; the settlement replaces it under the
// same id, wherever it was counted. An empty model or the asked one
// changes nothing.
func (c *Call) SetServedModel(model string) {
	c.mu.Lock()
	c.served = model
	c.mu.Unlock()
}

// SetOutcome makes o the settlement's outcome, in place of the one the
// middleware derives from the status: for a call the handler knows more
// about — OutcomeTimeout for an upstream that ran out of its own time
// (the request's deadline did not pass), OutcomeRejected for a call a
// request-path limiter refused after its estimate was sent. A rejected
// call's settlement carries no tokens, whatever was reported.
func (c *Call) SetOutcome(o schemas.Outcome) {
	c.mu.Lock()
	c.outcome = o
	c.mu.Unlock()
}

// SetAttribute adds an attribute to the settlement (the upstream's
// attempts, why a call ended). The middleware's own attributes (usage,
// cancelled, flags.ProbeAttribute) win over one of the
// same name. Keys and values must fit the event's limits
// (schemas.MaxAttributes and the lengths it names) or the settlement is
// invalid and dropped.
func (c *Call) SetAttribute(key, value string) {
	c.mu.Lock()
	if c.attrs == nil {
		c.attrs = map[string]string{}
	}
	c.attrs[key] = value
	c.mu.Unlock()
}

// probeKind is the kind of the half-open flag that let d through as a
// probe, or "" when d is no probe.
func probeKind(d checker.Decision) string {
	if d.Outcome != checker.Probe {
		return ""
	}
	if d.Flag == nil {
		return "unknown"
	}
	return string(d.Flag.Kind)
}

// meter serves an allowed request with estimate and settlement. probe is
// the half-open flag's kind when the request is a probe: the settlement
// carries it as flags.ProbeAttribute, so that the aggregator judges the
// half-open breaker by its probes.
func (m *mw) meter(w http.ResponseWriter, r *http.Request, next http.Handler, id Identity, probe string) {
	tenant, model, key := id.Tenant, id.Model, id.APIKeyID
	ep, ok := estimate.EndpointOf(r.URL.Path)
	if !ok {
		next.ServeHTTP(w, r)
		return
	}
	limit := m.est.Config().Limits.MaxBodyBytes
	if r.Body == nil {
		r.Body = http.NoBody
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			ratelimit.WriteError(w, http.StatusRequestEntityTooLarge, ratelimit.Error{Type: "invalid_request_error", Code: "request_too_large",
				Message: "The request body exceeds this gateway's limit of " + itoa(int64(limit)) + " bytes (max_body_bytes)."}, 0)
			return
		}
		ratelimit.WriteError(w, http.StatusBadRequest, ratelimit.Error{Type: "invalid_request_error", Code: "body_unreadable",
			Message: "The request body could not be read."}, 0)
		return
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }

	c := &Call{id: newID(), start: m.now(), probe: probe}
	c.est, c.estErr = m.est.Estimate(tenant, ep, body)
	if c.estErr == nil && c.est.Model == "" && model != "" {
		// The model is named by the path, not the body (Gemini's routes,
		// Azure's deployments): the ratio to read, and later to learn
		// (Observe below), is that model's, not one shared by them all.
		req := c.est.Request
		req.Model = model
		c.est = m.est.Complete(tenant, req)
	}
	if model == "" {
		model = c.est.Model
	}
	if model == "" {
		model = "unknown"
	}
	endpoint := r.URL.Path
	if len(endpoint) > schemas.MaxStringLen {
		endpoint = endpoint[:schemas.MaxStringLen]
	}
	base := schemas.UsageEvent{ID: c.id, Tenant: tenant, Model: model, APIKeyID: key, Endpoint: endpoint, Gateway: m.gateway,
		User: id.User, Priority: id.priority()}
	if m.fields != nil {
		m.applyFields(r, &base)
		if base.ID == "" {
			base.ID = c.id
		}
		c.id = base.ID
	}
	var span trace.Span
	if m.tracer != nil {
		r, span = m.startSpan(r, &base)
		defer func() { endSpan(span, c, base) }()
	}
	ticket, refused := m.admitted(w, r, c, &base)
	if refused {
		return
	}
	permit, refused := m.guarded(w, r, &base, tenant, model, ticket)
	if refused {
		return
	}
	if m.emitter != nil && !m.noEstimateEvents && c.estErr == nil {
		ev := base
		ev.Time, ev.Estimated = c.start.UTC(), true
		ev.PromptTokens, ev.CompletionTokens = clampTokens(c.est.Prompt), clampTokens(c.est.Completion)
		_ = m.emitter.Emit(&ev)
	}

	sw := &statusWriter{ResponseWriter: w}
	settled := false
	settle := func(panicked bool) {
		if settled {
			return
		}
		settled = true
		ev := m.settle(r.Context(), c, base, sw.status, panicked)
		c.settled = &ev
		permit.Release(guardOutcome(ev))
		if ticket != nil {
			// The client may be gone; the correction must still land.
			_ = ticket.Settle(context.WithoutCancel(r.Context()), admission.Usage{PromptTokens: ev.PromptTokens, CompletionTokens: ev.CompletionTokens,
				Cost: m.costOf(ev.Model, Usage{PromptTokens: ev.PromptTokens, CompletionTokens: ev.CompletionTokens, CachedTokens: ev.CachedTokens,
					CacheWriteTokens: ev.CacheWriteTokens, ReasoningTokens: ev.ReasoningTokens})})
		}
	}
	defer func() {
		if p := recover(); p != nil {
			settle(true)
			panic(p)
		}
	}()
	next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
	settle(false)
}

// admitted runs admission (WithAdmission) for the metered call c, whose
// events' common part is base. refused true means the refusal was
// answered and the handler must not run; otherwise ticket is the debit to
// settle (nil without admission).
//
// Admission runs after the flags (a flag refusal costs no Redis call) and
// before the estimate event: a refused request is not metered as a call,
// it is one refusal event. The user and priority are the events' (the
// Identity's, else WithEventFields'), so that user-scoped rules and
// reserves apply to what is metered. The estimate's Prompt + Completion
// cannot overflow (package estimate saturates), so no rule can be
// debited a wrapped-around figure.
func (m *mw) admitted(w http.ResponseWriter, r *http.Request, c *Call, base *schemas.UsageEvent) (ticket *admission.Ticket, refused bool) {
	if m.adm == nil {
		return nil, false
	}
	t, err := m.adm.Acquire(r.Context(), admission.Request{ID: base.ID, Tenant: base.Tenant, Model: base.Model, Key: base.APIKeyID,
		User: base.User, Priority: base.Priority, Endpoint: base.Endpoint,
		PromptTokens: c.est.Prompt, CompletionTokens: c.est.Completion,
		Cost: m.costOf(base.Model, Usage{PromptTokens: c.est.Prompt, CompletionTokens: c.est.Completion})})
	switch {
	case err != nil:
		// A request admission cannot judge (it names the bound it broke):
		// answer it as the bad request it is.
		ratelimit.WriteError(w, http.StatusBadRequest, ratelimit.Error{Type: "invalid_request_error", Code: "admission_refused", Message: err.Error()}, 0)
		return nil, true
	case !t.Allowed():
		if m.log != nil {
			m.log.LogAttrs(r.Context(), slog.LevelInfo, "sluice refused a request before the call",
				slog.String("tenant", base.Tenant), slog.String("model", base.Model), slog.String("api_key_id", base.APIKeyID),
				slog.String("user", base.User), slog.String("priority", string(base.Priority)),
				slog.String("rule", t.Decision.Rule), slog.Int64("limit", t.Decision.Limit))
		}
		if m.emitRefusals {
			ev := AdmissionRefusalEvent(*base, t.Decision.Rule, admission.Status(t.Decision), m.now())
			_ = m.emitter.Emit(&ev)
		}
		admission.WriteRefusal(w, t.Decision)
		return nil, true
	}
	admission.WriteHeaders(w.Header(), t.Decision)
	return &t, false
}

// settle emits c's settlement (see WithEstimates for the rules) and
// returns it.
func (m *mw) settle(ctx context.Context, c *Call, base schemas.UsageEvent, status int, panicked bool) schemas.UsageEvent {
	end := m.now()
	c.mu.Lock()
	u, reported, provider, outcome, served := c.usage, c.reported, c.provider, c.outcome, c.served
	attrs := make(map[string]string, len(base.Attributes)+len(c.attrs)+3)
	for k, v := range base.Attributes {
		attrs[k] = v
	}
	for k, v := range c.attrs {
		attrs[k] = v
	}
	c.mu.Unlock()

	ev := base
	ev.Time, ev.LatencyMS = end.UTC(), max(0, min(end.Sub(c.start).Milliseconds(), schemas.MaxLatencyMS))
	if provider != "" {
		ev.Provider = provider
	}
	if served != "" && served != ev.Model && schemas.CheckEventModel(served) == "" {
		ev.RequestedModel, ev.Model = ev.Model, served
	}
	ctxErr := ctx.Err()
	if reported && !panicked && status >= 200 && status < 300 {
		// The usage arrives at the end of a call: it completed, even if
		// the client closed the connection before the handler returned.
		ctxErr = nil
	}
	var cancelled bool
	switch {
	case panicked:
		if status == 0 {
			status = http.StatusInternalServerError
		}
		ev.Outcome = schemas.OutcomeError
	case errors.Is(ctxErr, context.DeadlineExceeded):
		if status == 0 {
			status = http.StatusGatewayTimeout
		}
		ev.Outcome = schemas.OutcomeTimeout
	case ctxErr != nil:
		// The client went away: not the upstream's failure, so no outcome
		// that an error-ratio breaker would count.
		if status == 0 {
			status = statusClientClosed
		}
		cancelled = true
	case status == 0:
		status = http.StatusOK // the handler wrote nothing: net/http answers 200
		ev.Outcome = schemas.OutcomeOK
	case status >= 500:
		ev.Outcome = schemas.OutcomeError
	default:
		ev.Outcome = schemas.OutcomeOK
	}
	if outcome != "" {
		ev.Outcome = outcome
	}
	ev.Status = status
	ok := ev.Outcome == schemas.OutcomeOK && status < 300
	switch {
	case ev.Outcome == schemas.OutcomeRejected:
		attrs["usage"] = "none"
	case reported:
		ev.PromptTokens, ev.CompletionTokens = clampTokens(u.PromptTokens), clampTokens(u.CompletionTokens)
		ev.CachedTokens = min(clampTokens(u.CachedTokens), ev.PromptTokens)
		ev.CacheWriteTokens = min(clampTokens(u.CacheWriteTokens), ev.PromptTokens-ev.CachedTokens)
		ev.ReasoningTokens = min(clampTokens(u.ReasoningTokens), ev.CompletionTokens)
		if u.Counted {
			attrs["usage"] = "counted"
		}
		if ok && !u.Counted {
			// Keyed by the model the estimate read the ratio of: the
			// body's, or the identity's when the body names none.
			m.est.Observe(base.Tenant, c.est.Model, u.PromptTokens, u.CompletionTokens)
		}
	case ok && c.estErr == nil:
		ev.PromptTokens, ev.CompletionTokens = clampTokens(c.est.Prompt), clampTokens(c.est.Completion)
		attrs["usage"] = "estimate"
	default:
		attrs["usage"] = "none"
	}
	if cancelled {
		attrs["cancelled"] = "client"
	}
	if c.probe != "" {
		attrs[flags.ProbeAttribute] = c.probe
	}
	ev.Attributes = nil
	if len(attrs) > 0 {
		ev.Attributes = attrs
	}
	if m.emitter != nil {
		out := ev
		_ = m.emitter.Emit(&out)
	}
	return ev
}

// AdmissionRefusalEvent is the usage event for a request admission
// refused with status: base's fields (tenant, model, key, user, ...), its
// id prefixed with "rej-" (a fresh id when base has none), outcome
// rejected, zero tokens, and attributes refused_by=admission and rule, the
// refusing rule (fail_closed when rule is empty: Redis was away and the
// tenant fails closed). A model base leaves out becomes "unknown", as in
// RefusalEvent. Gateways that admit without the middleware (services/authz)
// send the same.
func AdmissionRefusalEvent(base schemas.UsageEvent, rule string, status int, now time.Time) schemas.UsageEvent {
	ev := base
	if ev.ID == "" {
		ev.ID = newID()
	}
	if ev.Model == "" {
		ev.Model = "unknown"
	}
	ev.ID = "rej-" + ev.ID
	ev.Time, ev.Status, ev.Outcome = now.UTC(), status, schemas.OutcomeRejected
	ev.PromptTokens, ev.CompletionTokens, ev.CachedTokens, ev.Estimated = 0, 0, 0, false
	if rule == "" {
		rule = "fail_closed"
	}
	if len(rule) > schemas.MaxStringLen {
		rule = rule[:schemas.MaxStringLen]
	}
	ev.Attributes = map[string]string{"refused_by": "admission", "rule": rule}
	return ev
}

// statusClientClosed is the status recorded for a request whose client
// went away before any answer (nginx's 499; no response is sent).
const statusClientClosed = 499

func clampTokens(n int64) int64 { return max(0, min(n, schemas.MaxTokensPerEvent)) }

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

// statusWriter records the status the handler answered. It keeps the
// writer's Flush (streams) and unwraps for http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes a flush on, so streamed answers reach the client chunk by
// chunk.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

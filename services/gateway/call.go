package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// call is one API request as the gateway handles it, in the request's
// context from intake to the access log. The stages fill it in order:
// intake (who asks for what), admit (may it run, on which models), dispatch
// (which upstream answered), relay (what it used); end records how it
// ended, once.
type call struct {
	caller    *frontend.Caller
	req       request
	bodyModel string // the model the body names; req.Model is the one routed
	body      []byte
	endpoint  string
	dialect   string // the API of the route called (policy.Dialect*)
	sse       bool   // a Gemini stream asked for as Server Sent Events (?alt=sse)
	ep        estimate.Endpoint
	route     string
	ups       []*provider
	requestID string // the x-request-id answered
	eventID   string // usage event id, the gateway's (eventIDFor)
	priority  schemas.Priority
	deadline  time.Time // the caller's (priority.TimeoutHeader); zero: none
	user      string
	session   string // HeaderSession: the agent session or conversation
	start     time.Time

	// mc is the middleware's metered call (estimate and settlement); nil
	// until the flags let the call through.
	mc *middleware.Call

	// span is the call's server span; nil when tracing is off.
	span trace.Span

	// Filled while the call runs.
	upstream   string
	served     string // the model that served the call, once one did
	attempts   int
	usage      middleware.Usage
	source     usageSource
	upstreamID string
	// relaying is set once the upstream's answer is being relayed: from
	// then on what is written is the provider's, not the gateway's.
	relaying bool

	// How the call ended (end): the usage event's outcome, empty while it
	// runs and for a call whose client left (nobody's failure), and the
	// error code answered, or why it ended without one.
	outcome schemas.Outcome
	code    string
	ended   bool
}

// usageSource says where a call's settled tokens came from.
type usageSource uint8

const (
	// usageUnset: the call ended before the flags were asked (bad
	// request, unknown key); it is not a metered call.
	usageUnset usageSource = iota
	// usageNone: no call was billed (refused, failed before an answer).
	usageNone
	// usageReported: the provider's usage.
	usageReported
	// usageCounted: the gateway counted the text; the provider reported none.
	usageCounted
	// usageEstimate: the answer could not be read; settled at the estimate.
	usageEstimate
)

var usageSourceNames = [...]string{"", "none", "reported", "counted", "estimate"}

func (u usageSource) String() string { return usageSourceNames[u] }

// billed reports whether the source carries tokens the provider billed.
func (u usageSource) billed() bool { return u == usageReported || u == usageCounted }

// Why a call ended without an error answer of its own.
const (
	codeClientClosed = "client_closed"
	codeShutdown     = "shutdown"
	codeStreamCut    = "stream_cut"
	codeDeferred     = "deferred"
)

// end records how c ended: outcome is the usage event's (the middleware
// emits it with the settlement; empty leaves the middleware's own, which
// marks a client that left), code the error code answered or the reason
// above. The first end wins: a stage that already ended the call (a
// refusal written) is not overwritten by a later default.
func (c *call) end(outcome schemas.Outcome, code string) {
	if c.ended {
		return
	}
	c.outcome, c.code, c.ended = outcome, code, true
	if c.mc != nil && outcome != "" {
		c.mc.SetOutcome(outcome)
	}
}

// refuse answers w with OpenAI's error body and ends c as refused by the
// gateway with code: a call that never reached an upstream.
func (c *call) refuse(w http.ResponseWriter, status int, e ratelimit.Error, retryAfter time.Duration) {
	ratelimit.WriteError(w, status, e, retryAfter)
	c.end(schemas.OutcomeRejected, e.Code)
}

// badRequest refuses c with an invalid_request_error naming code.
func (c *call) badRequest(w http.ResponseWriter, status int, code, msg string) {
	c.refuse(w, status, ratelimit.Error{Type: "invalid_request_error", Code: code, Message: msg}, 0)
}

// badParam refuses c with an invalid_request_error naming the parameter.
func (c *call) badParam(w http.ResponseWriter, status int, param, code, msg string) {
	c.refuse(w, status, ratelimit.Error{Type: "invalid_request_error", Code: code, Message: msg, Param: &param}, 0)
}

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// identify tells the middleware who calls which model; requests without a
// call (never on the API paths) pass unchecked.
func identify(r *http.Request) (middleware.Identity, bool) {
	c := callFrom(r.Context())
	if c == nil {
		return middleware.Identity{}, false
	}
	return middleware.Identity{Tenant: c.caller.Tenant, Model: c.req.Model, APIKeyID: c.caller.KeyID}, true
}

// fillEvent gives every usage event of a call its id, user and priority.
func fillEvent(r *http.Request, ev *schemas.UsageEvent) {
	c := callFrom(r.Context())
	if c == nil {
		return
	}
	ev.ID, ev.User, ev.Priority, ev.SessionID = c.eventID, c.user, c.priority, c.session
	ev.Attributes = map[string]string{"request_id": c.requestID}
	if c.span != nil {
		// The event carries the call's trace to ingest and the aggregator.
		traceprop.Stamp(r.Context(), ev.Attributes)
	}
}

// startSpan starts c's server span, a child of the trace context the
// caller sent if any, and returns r with it in its context.
func (s *Server) startSpan(r *http.Request, c *call) *http.Request {
	ctx := traceprop.FromHTTP(r.Context(), r.Header)
	ctx, c.span = s.tracer.Start(ctx, traceprop.Operation(c.endpoint), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(c.start), trace.WithAttributes(attribute.String(traceprop.AttrRequestID, c.requestID)))
	return r.WithContext(ctx)
}

// endSpan records how c ended on its span and ends it.
func (c *call) endSpan(status int) {
	tc := traceprop.Call{Path: c.endpoint, Provider: c.upstream, RequestModel: c.req.Model, ResponseModel: c.served,
		EventID: c.eventID, Billed: c.source.billed(), InputTokens: c.usage.PromptTokens, OutputTokens: c.usage.CompletionTokens,
		Outcome: string(c.outcome), Status: status, Code: c.code}
	if c.caller != nil {
		tc.Tenant, tc.APIKeyID = c.caller.Tenant, c.caller.KeyID
	}
	if c.req.Model != "" {
		c.span.SetName(traceprop.SpanName(c.endpoint, c.req.Model))
	}
	tc.End(c.span)
}

// stage starts a child span of c's for one stage of the proxy and returns
// what ends it; nothing when tracing is off.
func (s *Server) stage(ctx context.Context, c *call, name string) func() {
	if c.span == nil {
		return func() {}
	}
	_, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	return func() { span.End() }
}

// finish records the access log line and the metrics of a request.
func (s *Server) finish(rw *recorder, c *call) {
	status := rw.status
	if status == 0 {
		status = statusClientClosed
	}
	end := s.now()
	class := "unauthenticated"
	tenant, key := "", ""
	if c.caller != nil {
		class, tenant, key = c.caller.Class, c.caller.Tenant, c.caller.KeyID
	}
	ep := c.ep.String()
	s.m.requests.WithLabelValues(class, c.route, ep, statusLabel(status)).Inc()
	if !rw.first.IsZero() {
		s.m.ttfb.WithLabelValues(ep, boolLabel(c.req.Stream)).Observe(rw.first.Sub(rw.start).Seconds())
	}
	if c.source != usageUnset {
		s.m.usage.WithLabelValues(c.source.String()).Inc()
	}
	if c.source.billed() {
		for kind, n := range map[string]int64{"prompt": c.usage.PromptTokens, "completion": c.usage.CompletionTokens,
			"cached": c.usage.CachedTokens, "cache_write": c.usage.CacheWriteTokens, "reasoning": c.usage.ReasoningTokens} {
			if n > 0 {
				s.m.tokens.WithLabelValues(class, c.route, kind).Add(float64(n))
			}
		}
	}
	attrs := []slog.Attr{
		slog.String("request_id", c.requestID), slog.String("tenant", tenant), slog.String("api_key_id", key),
		slog.String("model", c.req.Model), slog.String("endpoint", c.endpoint), slog.Bool("stream", c.req.Stream),
		slog.Int("status", status), slog.String("outcome", string(c.outcome)), slog.Int64("latency_ms", end.Sub(rw.start).Milliseconds()),
	}
	if c.code != "" {
		attrs = append(attrs, slog.String("code", c.code))
	}
	if !rw.first.IsZero() {
		attrs = append(attrs, slog.Int64("ttfb_ms", rw.first.Sub(rw.start).Milliseconds()))
	}
	if c.upstream != "" {
		attrs = append(attrs, slog.String("upstream", c.upstream), slog.Int("attempts", c.attempts))
	}
	if c.upstreamID != "" {
		attrs = append(attrs, slog.String("upstream_request_id", c.upstreamID))
	}
	if c.source != usageUnset {
		attrs = append(attrs, slog.String("usage", c.source.String()), slog.Int64("prompt_tokens", c.usage.PromptTokens),
			slog.Int64("completion_tokens", c.usage.CompletionTokens))
	}
	if c.eventID != c.requestID && c.eventID != "" {
		attrs = append(attrs, slog.String("event_id", c.eventID))
	}
	if c.span != nil {
		c.endSpan(status)
		if sc := c.span.SpanContext(); sc.IsValid() {
			attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
		}
	}
	// Never the prompt or the answer: an access log is read by more
	// people than the conversations it describes.
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// statusClientClosed is the status logged for a request whose client went
// away before any answer (nginx's 499; nothing is sent).
const statusClientClosed = 499

func statusLabel(code int) string { return fmt.Sprint(code) }

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// recorder records the status and the time of the first body byte, and
// keeps Flush for streams.
type recorder struct {
	http.ResponseWriter
	start  time.Time
	first  time.Time
	status int
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.first.IsZero() && len(b) > 0 {
		w.first = time.Now()
	}
	return w.ResponseWriter.Write(b)
}

func (w *recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

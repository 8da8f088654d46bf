package middleware

import (
	"net/http"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// WithTracing records an OpenTelemetry server span for every metered call
// (WithEstimates) on tp: a child of the request's W3C traceparent, named
// and attributed like sluice gateway's (sdk/go/traceprop: the GenAI
// conventions' provider, request and response model and token usage, with
// the tenant and outcome), and stamps the span's context on the call's
// usage events (attribute traceparent) so that ingest, the aggregator and
// the enforcer continue the trace (docs/tracing.md). A nil tp, or
// OpenTelemetry's no-op provider, records nothing and costs nothing.
// Requests the flags refuse, and paths that are not metered, get no span.
func WithTracing(tp trace.TracerProvider) Option {
	return func(m *mw) {
		m.tracer = nil
		if traceprop.On(tp) {
			m.tracer = traceprop.Tracer(tp, "sdk/go/middleware")
		}
	}
}

// startSpan starts the call's span and stamps its context on base's
// attributes (a copy: the map WithEventFields set is not changed).
func (m *mw) startSpan(r *http.Request, base *schemas.UsageEvent) (*http.Request, trace.Span) {
	ctx := traceprop.FromHTTP(r.Context(), r.Header)
	ctx, span := m.tracer.Start(ctx, traceprop.SpanName(r.URL.Path, base.Model), trace.WithSpanKind(trace.SpanKindServer))
	attrs := make(map[string]string, len(base.Attributes)+2)
	for k, v := range base.Attributes {
		attrs[k] = v
	}
	traceprop.Stamp(ctx, attrs)
	base.Attributes = attrs
	return r.WithContext(ctx), span
}

// endSpan records how the call ended — its settlement, or a refusal
// before it ran — on span and ends it.
func endSpan(span trace.Span, c *Call, base schemas.UsageEvent) {
	tc := traceprop.Call{Path: base.Endpoint, RequestModel: base.Model, Tenant: base.Tenant, APIKeyID: base.APIKeyID, EventID: base.ID,
		Outcome: string(schemas.OutcomeRejected)}
	if ev := c.settled; ev != nil {
		tc.Provider, tc.ResponseModel, tc.Outcome, tc.Status = ev.Provider, ev.Model, string(ev.Outcome), ev.Status
		if ev.RequestedModel != "" {
			tc.RequestModel = ev.RequestedModel
		}
		if u := ev.Attributes["usage"]; u != "none" && u != "estimate" {
			tc.Billed, tc.InputTokens, tc.OutputTokens = true, ev.PromptTokens, ev.CompletionTokens
		}
	}
	tc.End(span)
}

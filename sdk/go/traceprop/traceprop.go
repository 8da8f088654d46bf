// Package traceprop carries OpenTelemetry trace context through Sluice's
// pipeline in W3C Trace Context form (traceparent, tracestate): on a usage
// event, as its attributes, so that a call's context survives the
// Emitter's batches and the hop to ingest; on Kafka records, as headers
// beside the schema header, so that the aggregator's span for an event and
// the enforcer's span for the flag its signal wrote join the call's trace.
// It also names the span attributes of a metered call (the OpenTelemetry
// GenAI semantic conventions, and Sluice's own), shared by sluice gateway
// and the middleware. docs/tracing.md describes the contract.
//
// Nothing here costs more than a type check when the tracer provider is
// OpenTelemetry's no-op one (On reports false): callers skip the rest.
package traceprop

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/schemas"
)

// The W3C Trace Context keys: HTTP headers, Kafka record headers and
// usage event attributes all use these names.
const (
	TraceParent = "traceparent"
	TraceState  = "tracestate"
)

var w3c = propagation.TraceContext{}

// On reports whether tp records anything: false for nil and for
// OpenTelemetry's no-op provider, whose callers skip tracing altogether.
func On(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	_, off := tp.(noop.TracerProvider)
	return !off
}

// Tracer returns tp's tracer for a Sluice component, or the no-op one for
// a nil tp.
func Tracer(tp trace.TracerProvider, component string) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer("github.com/sluicehq/sluice/" + component)
}

// FromHTTP returns ctx with the trace context of an incoming request's
// headers, if it has one.
func FromHTTP(ctx context.Context, h map[string][]string) context.Context {
	return w3c.Extract(ctx, propagation.HeaderCarrier(h))
}

// Stamp puts the span context of ctx into attrs (a usage event's
// Attributes) as traceparent and, when it has one, tracestate. It does
// nothing for a context without a valid span context.
func Stamp(ctx context.Context, attrs map[string]string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	w3c.Inject(ctx, propagation.MapCarrier(attrs))
}

// EventContext returns ctx with the trace context ev's attributes carry,
// if any.
func EventContext(ctx context.Context, ev *schemas.UsageEvent) context.Context {
	if ev.Attributes[TraceParent] == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier(ev.Attributes))
}

// recordCarrier reads and writes a Kafka record's headers.
type recordCarrier struct{ r *kgo.Record }

func (c recordCarrier) Get(key string) string {
	for _, h := range c.r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c recordCarrier) Set(key, value string) {
	for i := range c.r.Headers {
		if c.r.Headers[i].Key == key {
			c.r.Headers[i].Value = []byte(value)
			return
		}
	}
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c recordCarrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}

// Inject adds the span context of ctx to rec's headers (traceparent and,
// when it has one, tracestate), keeping every other header. A record's
// Headers slice may be shared between records (a producer's constant
// schema header): Inject copies it before adding. It does nothing for a
// context without a valid span context.
func Inject(ctx context.Context, rec *kgo.Record) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	rec.Headers = append(make([]kgo.RecordHeader, 0, len(rec.Headers)+2), rec.Headers...)
	w3c.Inject(ctx, recordCarrier{rec})
}

// RecordContext returns ctx with the trace context of rec's headers, if
// it has one.
func RecordContext(ctx context.Context, rec *kgo.Record) context.Context {
	return w3c.Extract(ctx, recordCarrier{rec})
}

// EventHeaders returns the headers of ev's record: base, plus the trace
// context ev carries (its traceparent and tracestate attributes) when it
// carries one — then in a copy, base being shared between records.
func EventHeaders(base []kgo.RecordHeader, ev *schemas.UsageEvent) []kgo.RecordHeader {
	tp := ev.Attributes[TraceParent]
	if tp == "" {
		return base
	}
	out := append(make([]kgo.RecordHeader, 0, len(base)+2), base...)
	out = append(out, kgo.RecordHeader{Key: TraceParent, Value: []byte(tp)})
	if ts := ev.Attributes[TraceState]; ts != "" {
		out = append(out, kgo.RecordHeader{Key: TraceState, Value: []byte(ts)})
	}
	return out
}

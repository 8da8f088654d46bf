package aggregator

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Tracing (docs/tracing.md): with tracing on, counting an event whose
// record carries a trace context (traceparent header) is a span in that
// trace, and each signal the event caused carries the span's context in
// its record's headers, so the enforcer's span for the flag joins the
// trace. Events counted later (after a tenant's restore) and signals of a
// re-evaluation (a policy change) have no span.

// countTraced counts ev like count, inside a span that is a child of the
// trace context rec carries; the signals the event raised remember the
// span's context (p.traces) for their records.
func (a *aggregator) countTraced(p *partition, rec *kgo.Record, ev *schemas.UsageEvent, ref time.Time) tally.Result {
	ctx := traceprop.RecordContext(context.Background(), rec)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return a.count(p, ev, rec.Partition, rec.Offset, ref)
	}
	_, span := a.tracer.Start(ctx, "aggregator count usage event", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String(traceprop.AttrTenant, ev.Tenant), attribute.String(traceprop.AttrEventID, ev.ID),
			attribute.String(traceprop.AttrRequestModel, ev.Model), attribute.Bool("sluice.estimated", ev.Estimated),
			attribute.Int64("messaging.kafka.offset", rec.Offset), attribute.Int("messaging.destination.partition.id", int(rec.Partition))))
	before := len(p.state.PendingSignals())
	r := a.count(p, ev, rec.Partition, rec.Offset, ref)
	raised := p.state.PendingSignals()
	if len(raised) > before {
		sc := span.SpanContext()
		kinds := make([]string, 0, len(raised)-before)
		for _, sg := range raised[before:] {
			if p.traces == nil {
				p.traces = map[string]trace.SpanContext{}
			}
			p.traces[sg.ID] = sc
			kinds = append(kinds, string(sg.Kind))
		}
		span.SetAttributes(attribute.StringSlice("sluice.signals", kinds))
	}
	span.SetAttributes(attribute.String("sluice.result", resultNames[r]))
	span.End()
	return r
}

// traceSignal moves the span context that raised sg (if any) from p to b,
// beside the signal's payload: the record is built later, from b.
func (a *aggregator) traceSignal(p *partition, b *chstore.Batch, sg *schemas.Signal) {
	if a.tracer == nil {
		return
	}
	sc, ok := p.traces[sg.ID]
	if ok {
		delete(p.traces, sg.ID)
	}
	if b.Traces == nil {
		b.Traces = make([]trace.SpanContext, 0, len(b.Signals))
	}
	// Aligned with b.Signals; the zero context of a signal no event's
	// span raised injects nothing.
	b.Traces = append(b.Traces, sc)
}

// injectSignal adds the trace context of b's signal i to its record.
func injectSignal(rec *kgo.Record, b *chstore.Batch, i int) {
	if i < len(b.Traces) && b.Traces[i].IsValid() {
		traceprop.Inject(trace.ContextWithSpanContext(context.Background(), b.Traces[i]), rec)
	}
}

var resultNames = [...]string{tally.Accepted: "accepted", tally.Duplicate: "duplicate", tally.Rejected: "rejected",
	tally.Evicted: "evicted", tally.Held: "held", tally.TooFarAhead: "too_far_ahead"}

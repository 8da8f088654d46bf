package traceprop

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/schemas"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func traced(t *testing.T) context.Context {
	t.Helper()
	ctx := FromHTTP(context.Background(), map[string][]string{"Traceparent": {parent}, "Tracestate": {"vendor=x"}})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("the traceparent was not read")
	}
	return ctx
}

// TestRecordHeadersKeepTheirs: the trace context goes onto a record beside
// its own headers, without writing into a header slice other records
// share, and comes back out; a context without a trace adds nothing.
func TestRecordHeadersKeepTheirs(t *testing.T) {
	// Room to append in place, which Inject must not use.
	shared := make([]kgo.RecordHeader, 1, 4)
	shared[0] = kgo.RecordHeader{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaUsageV1)}
	rec := &kgo.Record{Headers: shared}
	Inject(traced(t), rec)
	if len(rec.Headers) != 3 || rec.Headers[0].Key != schemas.HeaderSchema || (recordCarrier{rec}).Get(TraceParent) != parent {
		t.Fatalf("headers %v", rec.Headers)
	}
	if full := shared[:cap(shared)]; full[1].Key != "" {
		t.Errorf("Inject wrote into the shared header slice: %v", full)
	}
	sc := trace.SpanContextFromContext(RecordContext(context.Background(), rec))
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || sc.TraceState().Get("vendor") != "x" {
		t.Errorf("read back %v", sc)
	}
	plain := &kgo.Record{Headers: shared}
	Inject(context.Background(), plain)
	if len(plain.Headers) != 1 {
		t.Errorf("a context without a trace added headers: %v", plain.Headers)
	}
}

// TestEventCarriesTheCall: the context stamped on an event's attributes
// becomes its record's headers (in a copy of the shared ones) and reads
// back; an event without one keeps the shared headers as they are.
func TestEventCarriesTheCall(t *testing.T) {
	ev := &schemas.UsageEvent{Attributes: map[string]string{"request_id": "r1"}}
	Stamp(traced(t), ev.Attributes)
	if ev.Attributes[TraceParent] != parent || ev.Attributes[TraceState] != "vendor=x" || ev.Attributes["request_id"] != "r1" {
		t.Fatalf("attributes %v", ev.Attributes)
	}
	base := make([]kgo.RecordHeader, 1, 4)
	base[0] = kgo.RecordHeader{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaUsageV1)}
	hs := EventHeaders(base, ev)
	rec := &kgo.Record{Headers: hs}
	if len(hs) != 3 || base[:2][1].Key != "" {
		t.Fatalf("headers %v (base %v)", hs, base[:cap(base)])
	}
	if got := trace.SpanContextFromContext(RecordContext(context.Background(), rec)); got.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("record context %v", got)
	}
	if got := trace.SpanContextFromContext(EventContext(context.Background(), ev)); got.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("event context %v", got)
	}
	bare := &schemas.UsageEvent{}
	if hs := EventHeaders(base, bare); len(hs) != 1 || &hs[0] != &base[0] {
		t.Errorf("an untraced event's headers %v", hs)
	}
	Stamp(context.Background(), bare.Attributes) // nil map, no trace: nothing to write
}

// TestOnSeesTheNoopProvider: the services skip tracing for nil and for
// OpenTelemetry's no-op provider.
func TestOnSeesTheNoopProvider(t *testing.T) {
	if On(nil) || On(noop.NewTracerProvider()) {
		t.Error("On is true for the no-op provider")
	}
}

package aggregator

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
)

const testParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func headerOf(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestRerouteKeepsTheTrace: a record produced again to its tenant's home
// partition keeps its trace context headers beside the schema and
// rerouted-from headers.
func TestRerouteKeepsTheTrace(t *testing.T) {
	a := newAggregator(DefaultConfig(), platform.Env{Metrics: prometheus.NewRegistry()}, policy.Static(&policy.Policy{}))
	p := &partition{id: 1}
	rec := &kgo.Record{Partition: 1, Offset: 7, Value: []byte("{}"), Headers: []kgo.RecordHeader{
		{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaUsageV1)},
		{Key: traceprop.TraceParent, Value: []byte(testParent)},
		{Key: traceprop.TraceState, Value: []byte("vendor=x")},
	}}
	a.reroute(p, rec, "acme", 0)
	out := p.reroutes[0]
	if headerOf(out, traceprop.TraceParent) != testParent || headerOf(out, traceprop.TraceState) != "vendor=x" ||
		headerOf(out, schemas.HeaderSchema) != schemas.SchemaUsageV1 || headerOf(out, HeaderReroutedFrom) != "1/7" {
		t.Errorf("rerouted record's headers %v", out.Headers)
	}
}

// TestSignalRecordsCarryTheEventsSpan: a signal raised by a traced event
// is produced with the context of the aggregator's span for that event;
// one raised without (a policy reload) carries none.
func TestSignalRecordsCarryTheEventsSpan(t *testing.T) {
	a := newAggregator(DefaultConfig(), platform.Env{Metrics: prometheus.NewRegistry()}, policy.Static(&policy.Policy{}))
	a.tracer = traceprop.Tracer(nil, "test") // any non-nil tracer turns the bookkeeping on
	sc := trace.SpanContextFromContext(traceprop.FromHTTP(context.Background(), map[string][]string{"Traceparent": {testParent}}))
	p := &partition{traces: map[string]trace.SpanContext{"sig-traced": sc}}
	b := &chstore.Batch{}
	for _, id := range []string{"sig-traced", "sig-plain"} {
		sg := schemas.Signal{ID: id, Tenant: "acme"}
		b.Signals = append(b.Signals, sg)
		b.Payloads = append(b.Payloads, []byte(`{}`))
		a.traceSignal(p, b, &sg)
	}
	if len(p.traces) != 0 {
		t.Errorf("contexts left behind after the drain: %v", p.traces)
	}
	recs := a.signalRecords(nil, b)
	if got := headerOf(recs[0], traceprop.TraceParent); got != testParent {
		t.Errorf("the traced signal's traceparent %q, want %q", got, testParent)
	}
	if got := headerOf(recs[1], traceprop.TraceParent); got != "" {
		t.Errorf("the untraced signal carries traceparent %q", got)
	}
	b.Reset()
	if len(b.Traces) != 0 {
		t.Error("Reset keeps the signals' contexts")
	}
}

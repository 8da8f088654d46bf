// Package tracingtest is an in-process OTLP/HTTP traces receiver for
// tests: point tracing.endpoint at Receiver.URL and read the spans the
// process exported, decoded from the protobuf the OpenTelemetry exporter
// sends.
package tracingtest

import (
	"cmp"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/platform/tracing"
)

// Span is one received span, its ids in hex as W3C traceparent writes
// them. Attrs holds its string attributes (lists of strings joined with
// commas), Ints its integer ones.
type Span struct {
	Name     string
	Service  string // the resource's service.name
	Scope    string // the tracer's name
	TraceID  string
	SpanID   string
	ParentID string // "" for a root
	Kind     int32  // OTLP's SpanKind: 2 server, 3 client, 4 producer, 5 consumer
	Attrs    map[string]string
	Ints     map[string]int64
	Links    []Link
	Error    bool // status code error
}

// Link is a span's link to another span.
type Link struct{ TraceID, SpanID string }

// Receiver collects the spans exported to it.
type Receiver struct {
	// URL is the OTLP/HTTP traces endpoint (tracing.endpoint).
	URL string

	t     testing.TB
	mu    sync.Mutex
	spans []Span
}

// NewReceiver starts a receiver that lives until t ends.
func NewReceiver(t testing.TB) *Receiver {
	r := &Receiver{t: t}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL + "/v1/traces"
	return r
}

// Provider returns a tracer provider exporting every span to r, with
// tracing's defaults otherwise; service names it (empty: the default).
func (r *Receiver) Provider(service string) *tracing.Provider {
	r.t.Helper()
	c := tracing.Defaults()
	c.Enabled, c.Endpoint = true, r.URL
	c.ServiceName = cmp.Or(service, c.ServiceName)
	p, err := tracing.New(c)
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &msg)
	}
	if err != nil {
		r.t.Errorf("tracingtest: undecodable export (%s): %v", req.Header.Get("Content-Type"), err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range msg.ResourceSpans {
		service := strAttrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				got = append(got, convert(sp, service, ss.GetScope().GetName()))
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func convert(sp *tracepb.Span, service, scope string) Span {
	s := Span{Name: sp.GetName(), Service: service, Scope: scope, TraceID: hex.EncodeToString(sp.GetTraceId()),
		SpanID: hex.EncodeToString(sp.GetSpanId()), Attrs: strAttrs(sp.GetAttributes()), Ints: map[string]int64{},
		Kind: int32(sp.GetKind()), Error: sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR}
	if p := sp.GetParentSpanId(); len(p) > 0 {
		s.ParentID = hex.EncodeToString(p)
	}
	for _, l := range sp.GetLinks() {
		s.Links = append(s.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
	}
	for _, kv := range sp.GetAttributes() {
		if v, ok := kv.GetValue().GetValue().(*commonpb.AnyValue_IntValue); ok {
			s.Ints[kv.GetKey()] = v.IntValue
		}
	}
	return s
}

func strAttrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_ArrayValue:
			// A list of strings, joined with commas.
			var parts []string
			for _, e := range v.ArrayValue.GetValues() {
				parts = append(parts, e.GetStringValue())
			}
			out[kv.GetKey()] = strings.Join(parts, ",")
		}
	}
	return out
}

// Spans returns a copy of the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Span, len(r.spans))
	copy(out, r.spans)
	return out
}

package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/platform/tracing/tracingtest"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// TestTracingSpanPerMeteredCall: with WithTracing, a metered call is a
// server span in the caller's trace with the GenAI attributes and the
// outcome, and both of its usage events carry the span's context; without
// it, the events carry none.
func TestTracingSpanPerMeteredCall(t *testing.T) {
	rcv := tracingtest.NewReceiver(t)
	tp := rcv.Provider("")
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	handler := func(w http.ResponseWriter, r *http.Request) {
		c := CallFrom(r.Context())
		c.SetProvider("openai")
		c.Report(Usage{PromptTokens: 31, CompletionTokens: 57})
		w.WriteHeader(http.StatusOK)
	}
	s := &emittertest.Recorder{}
	req := chatRequest(context.Background(), "acme")
	req.Header.Set("Traceparent", caller)
	metered(t, fixed{}, newEstimator(t), s, handler, WithTracing(tp)).ServeHTTP(httptest.NewRecorder(), req)
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1: %+v", len(spans), spans)
	}
	sp := spans[0]
	if sp.Name != "chat gpt-4o-mini" || sp.Kind != 2 || sp.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || sp.ParentID != "00f067aa0ba902b7" {
		t.Errorf("span %+v", sp)
	}
	for k, v := range map[string]string{traceprop.AttrProvider: "openai", traceprop.AttrRequestModel: "gpt-4o-mini",
		traceprop.AttrResponseModel: "gpt-4o-mini", traceprop.AttrTenant: "acme", traceprop.AttrOutcome: "ok"} {
		if sp.Attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, sp.Attrs[k], v)
		}
	}
	if sp.Ints[traceprop.AttrInputTokens] != 31 || sp.Ints[traceprop.AttrOutputTokens] != 57 {
		t.Errorf("tokens %v", sp.Ints)
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + sp.SpanID + "-01"
	e, settled := pair(t, s.Events())
	if e.Attributes[traceprop.TraceParent] != want || settled.Attributes[traceprop.TraceParent] != want {
		t.Errorf("events' traceparent %q / %q, want %q", e.Attributes[traceprop.TraceParent], settled.Attributes[traceprop.TraceParent], want)
	}

	untraced := &emittertest.Recorder{}
	req = chatRequest(context.Background(), "acme")
	req.Header.Set("Traceparent", caller)
	metered(t, fixed{}, newEstimator(t), untraced, handler).ServeHTTP(httptest.NewRecorder(), req)
	for _, ev := range untraced.Events() {
		if ev.Attributes[traceprop.TraceParent] != "" {
			t.Errorf("an event carries a traceparent without WithTracing: %+v", ev)
		}
	}
}

package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/tracing/tracingtest"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// tracedGateway is a gateway whose spans go to an in-process OTLP
// receiver; flush exports what it recorded.
func tracedGateway(t *testing.T) (*gw, *tracingtest.Receiver, func()) {
	t.Helper()
	rcv := tracingtest.NewReceiver(t)
	tp := rcv.Provider("gw-under-test")
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{StreamUsage: mockllm.UsageWhenAsked})), Deps{Tracing: tp})
	flush := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return g, rcv, flush
}

// The caller's own trace: a W3C traceparent it sends.
const (
	callerTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan   = "00f067aa0ba902b7"
	callerParent = "00-" + callerTrace + "-" + callerSpan + "-01"
)

// TestGatewaySpanPerCall: with tracing on, each API call is one server
// span in the caller's trace (the traceparent it sent), named and
// attributed as the GenAI conventions say — provider, requested and
// served model, input and output tokens — with the tenant and outcome,
// and the admission and dispatch stages as its children; the call's usage
// events carry the span's context (attribute traceparent), which is how
// the trace reaches ingest and the aggregator. A refused call is a span
// too, with its outcome and error code.
func TestGatewaySpanPerCall(t *testing.T) {
	g, rcv, flush := tracedGateway(t)
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme",
		`{"model":"gpt-4o","max_tokens":7,"messages":[{"role":"user","content":"hi there"}]}`,
		"X-Request-Id", "traced-1", "Traceparent", callerParent)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = post(t, g.url, "/v1/chat/completions", "sk-mini-only",
		`{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "traced-2")
	if resp.StatusCode != 403 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	ev := g.settlement(t, "traced-1")
	flush()

	spans := rcv.Spans()
	byName := map[string][]tracingtest.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	calls := byName["chat gpt-4o"]
	if len(calls) != 2 {
		t.Fatalf("%d spans named \"chat gpt-4o\", want 2 (one per call); got %+v", len(calls), spans)
	}
	var ok, refused tracingtest.Span
	for _, s := range calls {
		if s.Attrs[traceprop.AttrRequestID] == "traced-1" {
			ok = s
		} else {
			refused = s
		}
	}
	if ok.TraceID != callerTrace || ok.ParentID != callerSpan || ok.Kind != 2 || ok.Service != "gw-under-test" {
		t.Errorf("the call's span is not a server span in the caller's trace: %+v", ok)
	}
	want := map[string]string{traceprop.AttrOperation: "chat", traceprop.AttrProvider: "mock", traceprop.AttrSystem: "mock",
		traceprop.AttrRequestModel: "gpt-4o", traceprop.AttrResponseModel: "gpt-4o", traceprop.AttrTenant: "acme",
		traceprop.AttrOutcome: "ok", traceprop.AttrEventID: ev.ID}
	for k, v := range want {
		if ok.Attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, ok.Attrs[k], v)
		}
	}
	if ok.Ints[traceprop.AttrInputTokens] != ev.PromptTokens || ok.Ints[traceprop.AttrOutputTokens] != 7 || ok.Ints[traceprop.AttrStatus] != 200 {
		t.Errorf("tokens and status %v, want input %d, output 7, status 200", ok.Ints, ev.PromptTokens)
	}
	for _, stage := range []string{"sluice.admit", "sluice.dispatch"} {
		if s := byName[stage]; len(s) != 1 || s[0].ParentID != ok.SpanID || s[0].TraceID != callerTrace {
			t.Errorf("%s: %+v, want one child of the call's span", stage, s)
		}
	}
	if tp := ev.Attributes[traceprop.TraceParent]; tp != "00-"+callerTrace+"-"+ok.SpanID+"-01" {
		t.Errorf("the settlement's traceparent %q does not name the call's span %s", tp, ok.SpanID)
	}
	if refused.Attrs[traceprop.AttrOutcome] != "rejected" || refused.Attrs[traceprop.AttrCode] != "model_not_allowed" ||
		refused.Attrs[traceprop.AttrTenant] != "trial" || refused.Ints[traceprop.AttrStatus] != 403 || refused.ParentID != "" {
		t.Errorf("the refused call's span: %+v", refused)
	}
}

// TestGatewayUntracedByDefault: with tracing off (no provider, as
// tracing.enabled false gives), a caller's traceparent goes nowhere: the
// usage events carry none.
func TestGatewayUntracedByDefault(t *testing.T) {
	g := startGateway(t, oneUpstream(t, mock(t, mockllm.Options{StreamUsage: mockllm.UsageWhenAsked})), Deps{})
	resp, body := post(t, g.url, "/v1/chat/completions", "sk-acme",
		`{"model":"gpt-4o","max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", "untraced", "Traceparent", callerParent)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, ev := range g.sink.Events() {
		for k := range ev.Attributes {
			if strings.HasPrefix(k, "trace") {
				t.Errorf("event %s carries %s with tracing off", ev.ID, k)
			}
		}
	}
}

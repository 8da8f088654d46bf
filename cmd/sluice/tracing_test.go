package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/tracing/tracingtest"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// TestOneTraceFromCallToFlag: `sluice run ingest aggregator enforcer
// gateway` in one process with tracing on, exporting to an in-process
// OTLP receiver. A call that takes its tenant past the hourly quota is
// one trace: the gateway's server span (the caller's traceparent its
// parent), ingest's span for each of its usage events, the aggregator's
// span counting the event that raised the exhausted signal, and the
// enforcer's span applying that signal, which changed the tenant's
// breaker (the flag the next call is refused by) — each the child of the
// one before, carried through the usage event, the usage topic's record
// headers and the signal's.
func TestOneTraceFromCallToFlag(t *testing.T) {
	dir := t.TempDir()
	up := httptest.NewServer(mockllm.New(mockllm.Options{StreamUsage: mockllm.UsageWhenAsked}))
	defer up.Close()
	rcv := tracingtest.NewReceiver(t)

	cfg, sink := withIngest(t, dir, itest.Unique(t, "traced_usage"))
	cfg.ClickHouse, cfg.Migrate = itest.ClickHouse(t), true
	cfg.SignalAuth = itest.SignalAuth(t)
	cfg.Redis.KeyPrefix = itest.Unique(t, "traced") + ":"
	cfg.Tracing.Enabled, cfg.Tracing.Endpoint, cfg.Tracing.Interval = true, rcv.URL, 100*time.Millisecond
	sv := &cfg.Services
	sv.Aggregator.Group = itest.Unique(t, "traced_agg")
	sv.Aggregator.FlushInterval = 100 * time.Millisecond
	sv.Enforcer.Group = itest.Unique(t, "traced_enf")
	g := &sv.Gateway
	g.Listen, g.Name = freeAddr(t), cfg.Redis.KeyPrefix+"gateway"
	g.Usage.EventSink = sink
	g.Usage.FlushInterval = 20 * time.Millisecond
	cfg.TenantKeys.File = writeFile(t, dir, "gateway-keys.yaml", "keys:\n"+frontend.KeyLine("traced", "sk-traced", "traced", nil))
	cfg.Policy.File = writeFile(t, dir, "policy.yaml", `defaults:
  timezone: UTC
  mode: hard
  fail_mode: open
  models:
    "*":
      monthly_tokens: 1000000000
tenants:
  traced:
    models:
      "*":
        hourly_tokens: 100
        monthly_tokens: 1000000000
`+upstreamPolicy(up.URL))
	stop := runPipeline(t, &cfg, []string{"ingest", "aggregator", "enforcer", "gateway"}, itest.Logger(t), g.Listen, sv.Ingest.Listen)
	defer stop()

	const (
		trace  = "0af7651916cd43dd8448eb211c80319c"
		parent = "b7ad6b7169203331"
	)
	code, body := chat(t, "http://"+g.Listen+"/v1/chat/completions", "sk-traced",
		`{"model":"gpt-4o","max_tokens":150,"messages":[{"role":"user","content":"spend the hour"}]}`, "Traceparent", "00-"+trace+"-"+parent+"-01")
	if code != 200 {
		t.Fatalf("the call: %d %s", code, body)
	}

	// The chain, each span the child of the one before, all in the
	// caller's trace.
	var chain []tracingtest.Span
	itest.EventuallyNoError(t, 90*time.Second, "gateway → ingest → aggregator → enforcer spans in one trace", func() error {
		chain = chain[:0]
		spans := rcv.Spans()
		find := func(parentID string, match func(tracingtest.Span) bool) (tracingtest.Span, bool) {
			for _, s := range spans {
				if s.TraceID == trace && s.ParentID == parentID && match(s) {
					return s, true
				}
			}
			return tracingtest.Span{}, false
		}
		gw, ok := find(parent, func(s tracingtest.Span) bool { return s.Name == "chat gpt-4o" })
		if !ok {
			return fmt.Errorf("no gateway span yet (%d spans)", len(spans))
		}
		chain = append(chain, gw)
		// Either of the call's events (the estimate or the settlement) may
		// be the one that crossed the quota: follow each ingest span.
		for _, in := range spans {
			if in.TraceID != trace || in.ParentID != gw.SpanID || in.Name != "ingest usage event" {
				continue
			}
			agg, ok := find(in.SpanID, func(s tracingtest.Span) bool { return s.Name == "aggregator count usage event" })
			if !ok {
				continue
			}
			enf, ok := find(agg.SpanID, func(s tracingtest.Span) bool {
				return s.Name == "enforcer apply signal" && s.Attrs["sluice.signal.kind"] == "quota_exhausted"
			})
			if !ok {
				continue
			}
			chain = append(chain, in, agg, enf)
			return nil
		}
		return fmt.Errorf("the gateway span %s has no ingest → aggregator → enforcer chain yet; spans: %s", gw.SpanID, names(spans))
	})
	gw, in, agg, enf := chain[0], chain[1], chain[2], chain[3]
	if gw.Attrs[traceprop.AttrTenant] != "traced" || gw.Ints[traceprop.AttrOutputTokens] != 150 {
		t.Errorf("gateway span: %+v", gw)
	}
	if in.Attrs[traceprop.AttrTenant] != "traced" || in.Attrs[traceprop.AttrEventID] == "" {
		t.Errorf("ingest span: %+v", in)
	}
	if agg.Attrs["sluice.result"] != "accepted" || agg.Attrs[traceprop.AttrEventID] != in.Attrs[traceprop.AttrEventID] {
		t.Errorf("aggregator span: %+v", agg)
	}
	if !strings.Contains(agg.Attrs["sluice.signals"], "quota_exhausted") {
		t.Errorf("the aggregator span does not name the signal it raised: %+v", agg)
	}
	if enf.Attrs["sluice.result"] != "changed" || enf.Attrs[traceprop.AttrTenant] != "traced" || enf.Attrs["sluice.signal.quota"] != "hourly_tokens" {
		t.Errorf("enforcer span: %+v", enf)
	}
	// The flag that span changed refuses the tenant's next call.
	itest.EventuallyNoError(t, 30*time.Second, "the next call is refused", func() error {
		if code, body := chat(t, "http://"+g.Listen+"/v1/chat/completions", "sk-traced",
			`{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":"more"}]}`); code != 429 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
}

// chat posts body to url with key and headers, and returns the status
// and body of the answer.
func chat(t *testing.T, url, key, body string, header ...string) (int, string) {
	t.Helper()
	resp, answer := itest.Send(t, http.MethodPost, url, body, append([]string{"Authorization", "Bearer " + key, "Content-Type", "application/json"}, header...)...)
	return resp.StatusCode, answer
}

func names(spans []tracingtest.Span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "\n  %s %s parent %s trace %s %v", s.Name, s.SpanID, s.ParentID, s.TraceID, s.Attrs)
	}
	return b.String()
}

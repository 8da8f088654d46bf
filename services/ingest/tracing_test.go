package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/tracing/tracingtest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// TestTraceContextReachesTheRecords: with tracing on, every record ingest
// produces keeps its schema header and gains the context of ingest's span
// for its event — a child of the context the event carries (its
// traceparent attribute, a traced gateway call's) or else of the
// request's traceparent header — one request of one event and one of two
// alike. Without tracing the records carry the schema header alone.
func TestTraceContextReachesTheRecords(t *testing.T) {
	const (
		reqTrace, reqSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		evTrace, evSpan   = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	)
	rcv := tracingtest.NewReceiver(t)
	tp := rcv.Provider("")
	inst := startTracedIngest(t, tp, nil)
	stamped := func(id string) string {
		return fmt.Sprintf(`{"id":%q,"time":"%s","tenant":"acme","model":"gpt-4o","prompt_tokens":1,"completion_tokens":1,"attributes":{"traceparent":"00-%s-%s-01"}}`,
			id, time.Now().UTC().Format(time.RFC3339Nano), evTrace, evSpan)
	}
	for _, body := range []string{eventJSON("plain-1", "acme"), batchJSON(eventJSON("plain-2", "acme"), stamped("stamped-2")), stamped("stamped-1")} {
		if a := post(t, inst.url, testKey, "", []byte(body), "Traceparent", "00-"+reqTrace+"-"+reqSpan+"-01"); a.code != http.StatusAccepted {
			t.Fatalf("%d %s", a.code, a.raw)
		}
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := map[string]tracingtest.Span{} // by event id
	for _, s := range rcv.Spans() {
		spans[s.Attrs[traceprop.AttrEventID]] = s
	}
	recs := itest.ReadTopic(t, inst.kafka, inst.topic)
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4", len(recs))
	}
	for _, rec := range recs {
		var ev schemas.UsageEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatal(err)
		}
		id := ev.ID
		sp, ok := spans[id]
		wantTrace, wantParent := reqTrace, reqSpan
		if strings.HasPrefix(id, "stamped") {
			wantTrace, wantParent = evTrace, evSpan
		}
		if !ok || sp.TraceID != wantTrace || sp.ParentID != wantParent || sp.Name != "ingest usage event" {
			t.Errorf("%s: span %+v, want a child of %s in trace %s", id, sp, wantParent, wantTrace)
		}
		if got := header(rec, traceprop.TraceParent); got != "00-"+wantTrace+"-"+sp.SpanID+"-01" {
			t.Errorf("%s: traceparent header %q, want ingest's span %s", id, got, sp.SpanID)
		}
		if header(rec, schemas.HeaderSchema) != schemas.SchemaUsageV1 {
			t.Errorf("%s: schema header lost: %v", id, rec.Headers)
		}
	}

	untraced := startIngest(t, nil)
	if a := post(t, untraced.url, testKey, "", []byte(eventJSON("off-1", "acme")), "Traceparent", "00-"+reqTrace+"-"+reqSpan+"-01"); a.code != http.StatusAccepted {
		t.Fatalf("%d %s", a.code, a.raw)
	}
	for _, rec := range itest.ReadTopic(t, untraced.kafka, untraced.topic) {
		if len(rec.Headers) != 1 {
			t.Errorf("tracing off, the record has headers %v", rec.Headers)
		}
	}
}

func header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

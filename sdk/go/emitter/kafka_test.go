package emitter

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// TestKafkaSenderDeliversAcrossBrokerOutage cuts the broker while events
// are buffered and keeps emitting; after the broker is back, Flush delivers
// every buffered event exactly once.
func TestKafkaSenderDeliversAcrossBrokerOutage(t *testing.T) {
	kc := itest.Kafka(t)
	topic := itest.Unique(t, "emitter_")
	proxy := itest.NewProxy(t, kc.Brokers[0])
	admin, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkaconn.EnsureTopics(ctx, admin, kc, topic); err != nil {
		t.Fatal(err)
	}
	sender, err := NewKafkaSender(topic, kgo.SeedBrokers(kc.Brokers...), kgo.Dialer(proxy.Dial))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	e, _ := newEmitter(t, sender, func(c *Config) {
		c.BatchSize = 50
		// Longer than the outage: records on the wire at the cut stay with
		// the idempotent producer, which delivers them once.
		c.SendTimeout = 60 * time.Second
		c.MaxBackoff = 500 * time.Millisecond
	})

	const before, during = 200, 300
	for i := range before {
		if err := e.Emit(event(fmt.Sprint("k-", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	for i := before; i < before+during; i++ {
		if err := e.Emit(event(fmt.Sprint("k-", i))); err != nil {
			t.Fatal(err)
		}
	}
	// While cut, a flush cannot complete.
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	if err := e.Flush(short); err == nil {
		cancelShort()
		t.Fatal("Flush succeeded while the broker was unreachable")
	}
	cancelShort()
	proxy.Restore()
	if err := e.Flush(ctx); err != nil {
		t.Fatalf("Flush after the broker is back: %v", err)
	}
	counts := readIDs(t, kc, topic)
	for i := range before + during {
		if n := counts[fmt.Sprint("k-", i)]; n != 1 {
			t.Errorf("k-%d is in the topic %d times, want exactly 1", i, n)
		}
	}
}

// TestKafkaSenderCarriesTheTraceContext: an event stamped with its call's
// trace context (attribute traceparent, sdk/go/traceprop) is produced with
// traceparent and tracestate headers beside the schema header; an event
// without one keeps the schema header alone.
func TestKafkaSenderCarriesTheTraceContext(t *testing.T) {
	kc := itest.Kafka(t)
	topic := itest.Unique(t, "emitter_trace_")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := kafkaconn.EnsureTopics(ctx, admin, kc, topic); err != nil {
		t.Fatal(err)
	}
	sender, err := NewKafkaSender(topic, kgo.SeedBrokers(kc.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traced := *event("traced")
	traced.Attributes = map[string]string{"traceparent": parent, "tracestate": "vendor=x"}
	if rej, err := sender.Send(ctx, []schemas.UsageEvent{traced, *event("plain")}); err != nil || len(rej) > 0 {
		t.Fatalf("send: %v %v", rej, err)
	}
	cl, err := kafkaconn.NewClient(kc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	headers := map[string]map[string]string{}
	for len(headers) < 2 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			var ev schemas.UsageEvent
			if err := json.Unmarshal(r.Value, &ev); err != nil {
				t.Fatal(err)
			}
			hs := map[string]string{}
			for _, h := range r.Headers {
				hs[h.Key] = string(h.Value)
			}
			headers[ev.ID] = hs
		})
	}
	if h := headers["traced"]; h["traceparent"] != parent || h["tracestate"] != "vendor=x" || h[schemas.HeaderSchema] != schemas.SchemaUsageV1 || len(h) != 3 {
		t.Errorf("traced event's headers %v", h)
	}
	if h := headers["plain"]; len(h) != 1 || h[schemas.HeaderSchema] != schemas.SchemaUsageV1 {
		t.Errorf("plain event's headers %v", h)
	}
}

func readIDs(t *testing.T, kc kafkaconn.Config, topic string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, r := range itest.ReadTopic(t, kc, topic) {
		var ev schemas.UsageEvent
		if err := json.Unmarshal(r.Value, &ev); err != nil || string(r.Key) != ev.Tenant {
			t.Errorf("bad record %q: %v", r.Value, err)
		}
		counts[ev.ID]++
	}
	return counts
}

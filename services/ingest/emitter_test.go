package ingest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/emitter"
)

// TestEmitterThroughIngestAcrossBrokerOutage is the whole gateway path: the
// SDK Emitter posts to ingest, the broker behind ingest goes away and comes
// back, and every event the Emitter buffered ends up in the topic exactly
// once (ingest's dedup absorbs the Emitter's retries).
func TestEmitterThroughIngestAcrossBrokerOutage(t *testing.T) {
	kc := itest.Kafka(t)
	proxy := itest.NewProxy(t, kc.Brokers[0])
	inst := startIngest(t, func(c *Config) { c.ProduceTimeout = 2 * time.Second }, proxyDialer(proxy))
	em, err := emitter.New(&emitter.HTTPSender{URL: inst.url, APIKey: testKey, Gzip: true}, emitter.Config{
		BatchSize: 100, FlushInterval: 20 * time.Millisecond, MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	emit := func(from, to int) {
		for i := from; i < to; i++ {
			ev := schemas.UsageEvent{ID: fmt.Sprint("em-", i), Time: time.Now().UTC(), Tenant: fmt.Sprint("t", i%7), Model: "m", PromptTokens: int64(i), CompletionTokens: 1}
			if err := em.Emit(&ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	emit(0, 300)
	if err := em.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	emit(300, 800)
	short, cancelShort := context.WithTimeout(ctx, 4*time.Second)
	if err := em.Flush(short); err == nil {
		t.Error("Flush succeeded while the broker was unreachable: ingest answered 2xx without an acknowledgement")
	}
	cancelShort()
	proxy.Restore()
	if err := em.Close(ctx); err != nil {
		t.Fatalf("Close after the broker is back: %v", err)
	}
	counts := idCounts(t, itest.ReadTopic(t, inst.kafka, inst.topic))
	for i := range 800 {
		if n := counts[fmt.Sprint("em-", i)]; n != 1 {
			t.Errorf("em-%d is in the topic %d times, want exactly 1", i, n)
		}
	}
}

package emitter

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// KafkaSender produces events straight to the usage topic, for gateways
// inside the cluster's network: the same records ingest would write (key =
// tenant, value = usage event v1 JSON, header schema: sluice.usage.v1),
// with an idempotent acks=all producer. It skips ingest's dedup window; the
// aggregator's dedup by id still applies.
type KafkaSender struct {
	cl     *kgo.Client
	header []kgo.RecordHeader
}

// NewKafkaSender produces to topic (schemas.TopicUsageV1 in production)
// through a franz-go client made of opts, which name the brokers and the
// connection (kgo.SeedBrokers, kgo.DialTLSConfig, kgo.SASL, kgo.ClientID);
// they come after the sender's own producer settings, so they may change
// them.
func NewKafkaSender(topic string, opts ...kgo.Opt) (*KafkaSender, error) {
	all := append([]kgo.Opt{
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
		// No delivery timeout: a record handed to the client is the
		// client's to deliver, retried until the broker is back; failing
		// it and sending it again would risk a duplicate. The emitter's
		// buffer bound caps what waits.
		kgo.RecordDeliveryTimeout(0),
	}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("emitter: Kafka client: %w", err)
	}
	return &KafkaSender{cl: cl, header: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaUsageV1)}}}, nil
}

// Close flushes and closes the producer; call it after Emitter.Close.
func (s *KafkaSender) Close() { s.cl.Close() }

// Send implements Sender. Records carry ctx, so when it ends the producer
// fails the ones it has not sent yet, which are safe to send again. A record
// that was already on the wire when ctx ended cannot be taken back: Send
// returns it for retry too, and if the broker did write it the retry is a
// duplicate that the aggregator's dedup by id removes.
func (s *KafkaSender) Send(ctx context.Context, events []schemas.UsageEvent) ([]Rejection, error) {
	var (
		mu       sync.Mutex
		acked    = make([]bool, len(events))
		left     = len(events)
		allDone  = make(chan struct{})
		firstErr error
	)
	buf := make([]byte, 0, 256*len(events))
	ends := make([]int, len(events))
	for i := range events {
		buf = eventjson.AppendUsageEventJSON(buf, &events[i])
		ends[i] = len(buf)
	}
	recs := make([]kgo.Record, len(events))
	prev := 0
	for i := range events {
		// An event stamped with its call's trace context (sdk/go/traceprop)
		// takes it into its record's headers, for the aggregator's span.
		recs[i] = kgo.Record{Key: []byte(events[i].Tenant), Value: buf[prev:ends[i]:ends[i]], Headers: traceprop.EventHeaders(s.header, &events[i])}
		prev = ends[i]
		s.cl.Produce(ctx, &recs[i], func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				acked[i] = true
			} else if firstErr == nil {
				firstErr = err
			}
			if left--; left == 0 {
				close(allDone)
			}
		})
	}
	select {
	case <-allDone:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	var retry []int
	for i, ok := range acked {
		if !ok {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return nil, nil
	}
	cause := firstErr
	if cause == nil {
		cause = ctx.Err()
	}
	return nil, &RetryError{Err: fmt.Errorf("%d of %d records not acknowledged: %w", len(retry), len(events), cause), Indexes: retry}
}

package reconciler

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/schemas"
)

// ProducerOptions are the franz-go options for publishing signals:
// idempotent, acks from all in-sync replicas.
func ProducerOptions() []kgo.Opt {
	return []kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0)}
}

// KafkaPublisher produces signals to Topic (schemas.TopicSignalsV1 when
// empty), keyed by tenant like the aggregator's, with the schema header.
type KafkaPublisher struct {
	Client *kgo.Client
	Topic  string
}

// Publish produces every signal and waits for the acknowledgements.
func (p *KafkaPublisher) Publish(ctx context.Context, signals []schemas.Signal) error {
	topic := p.Topic
	if topic == "" {
		topic = schemas.TopicSignalsV1
	}
	recs := make([]*kgo.Record, 0, len(signals))
	for i := range signals {
		v, err := schemas.EncodeSignal(&signals[i])
		if err != nil {
			return fmt.Errorf("reconciler: encode signal %s: %w", signals[i].ID, err)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(signals[i].Tenant), Value: v,
			Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaSignalsV1)}}})
	}
	return p.Client.ProduceSync(ctx, recs...).FirstErr()
}

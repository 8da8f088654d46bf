package reconciler

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// ProducerOptions are the franz-go options for publishing signals:
// idempotent, acks from all in-sync replicas.
func ProducerOptions() []kgo.Opt {
	return []kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0)}
}

// KafkaPublisher produces signals to Topic (topics.signals), keyed by tenant like the aggregator's, with the schema header,
// signed by Auth.
type KafkaPublisher struct {
	Client *kgo.Client
	Topic  string
	// Auth signs the records; the enforcer and alerter refuse unsigned
	// ones, so a publisher without it refuses to publish.
	Auth *signalauth.Auth
}

// Publish produces every signal and waits for the acknowledgements.
func (p *KafkaPublisher) Publish(ctx context.Context, signals []schemas.Signal) error {
	if p.Auth == nil {
		return errors.New("reconciler: KafkaPublisher.Auth is nil: open one with signalauth.Open (signal_auth settings)")
	}
	if p.Topic == "" {
		return errors.New("reconciler: KafkaPublisher.Topic is empty: name the signals topic (topics.signals)")
	}
	recs := make([]*kgo.Record, 0, len(signals))
	for i := range signals {
		v, err := schemas.EncodeSignal(&signals[i])
		if err != nil {
			return fmt.Errorf("reconciler: encode signal %s: %w", signals[i].ID, err)
		}
		recs = append(recs, p.Auth.Record(p.Topic, []byte(signals[i].Tenant), v))
	}
	return p.Client.ProduceSync(ctx, recs...).FirstErr()
}

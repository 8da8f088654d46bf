// Package kafkaconn builds franz-go clients for Sluice's topics from one
// configuration, creates the topics a service needs, and answers readiness.
package kafkaconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config says how to reach the Kafka cluster. An empty Brokers list means
// "no broker configured"; `sluice` then starts an embedded one (see
// devbroker.Start) for development.
type Config struct {
	Brokers           []string      `yaml:"brokers" help:"seed brokers, host:port, comma separated"`
	ClientID          string        `yaml:"client_id" help:"Kafka client id prefix"`
	DialTimeout       time.Duration `yaml:"dial_timeout" help:"timeout for one broker connection attempt"`
	Partitions        int32         `yaml:"partitions" help:"partitions for topics Sluice creates"`
	ReplicationFactor int16         `yaml:"replication_factor" help:"replication factor for topics Sluice creates (-1: broker default)"`
}

// Defaults: 6 partitions (the unit of aggregator scale-out), broker-default
// replication.
func Defaults() Config {
	return Config{ClientID: "sluice", DialTimeout: 5 * time.Second, Partitions: 6, ReplicationFactor: -1}
}

// Validate checks every broker address and the topic settings.
func (c Config) Validate() error {
	var errs []error
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			errs = append(errs, fmt.Errorf("kafka.brokers: %q is not host:port", b))
		}
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, errors.New("kafka.dial_timeout: must be positive"))
	}
	if c.Partitions < 1 || c.Partitions > 10000 {
		errs = append(errs, fmt.Errorf("kafka.partitions: %d is outside 1..10000", c.Partitions))
	}
	if c.ReplicationFactor == 0 || c.ReplicationFactor < -1 {
		errs = append(errs, fmt.Errorf("kafka.replication_factor: %d must be -1 (broker default) or at least 1", c.ReplicationFactor))
	}
	return errors.Join(errs...)
}

// Options returns the base client options for c followed by extra, so a
// service adds only what is particular to it (producer or consumer group).
func (c Config) Options(extra ...kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		kgo.DialTimeout(c.DialTimeout),
	}
	return append(opts, extra...)
}

// NewClient returns a client for c with extra options applied.
func NewClient(c Config, extra ...kgo.Opt) (*kgo.Client, error) {
	if len(c.Brokers) == 0 {
		return nil, errors.New("kafka: no brokers configured; set kafka.brokers (SLUICE_KAFKA_BROKERS)")
	}
	cl, err := kgo.NewClient(c.Options(extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new client: %w", err)
	}
	return cl, nil
}

// EnsureTopics creates each missing topic with c's partitions and
// replication factor. Existing topics are left as they are.
func EnsureTopics(ctx context.Context, cl *kgo.Client, c Config, topics ...string) error {
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopics(ctx, c.Partitions, c.ReplicationFactor, nil, topics...)
	if err != nil {
		return fmt.Errorf("kafka: create topics %v: %w", topics, err)
	}
	for _, r := range resp.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafka: create topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// Ready returns a readiness check that pings the cluster.
func Ready(cl *kgo.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := cl.Ping(ctx); err != nil {
			return fmt.Errorf("kafka unreachable: %w", err)
		}
		return nil
	}
}

// Package kafkaconn builds franz-go clients for Sluice's topics from one
// configuration, creates the topics a service needs, and answers readiness.
package kafkaconn

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// Config says how to reach the Kafka cluster. An empty Brokers list means
// "no broker configured"; `sluice` then starts an embedded one (see
// devbroker.Start) for development.
type Config struct {
	Brokers           []string         `yaml:"brokers" help:"seed brokers, host:port, comma separated"`
	ClientID          string           `yaml:"client_id" help:"Kafka client id prefix"`
	DialTimeout       time.Duration    `yaml:"dial_timeout" help:"timeout for one broker connection attempt"`
	Partitions        int32            `yaml:"partitions" help:"partitions for topics Sluice creates"`
	ReplicationFactor int16            `yaml:"replication_factor" help:"replication factor for topics Sluice creates (-1: broker default). Sluice gives a topic it creates min.insync.replicas = min(2, RF-1) when that is above the broker's own min.insync.replicas (RF 3 or more: 2, so acks=all means two copies and one broker may be down); RF 1 or 2 keeps the broker's setting"`
	TLS               tlsconfig.Config `yaml:"tls"`
	SASL              SASL             `yaml:"sasl"`
}

// SASL authenticates the client to the brokers. Only SCRAM is offered:
// PLAIN sends the password itself and would need TLS to be safe, SCRAM
// never sends it.
type SASL struct {
	Mechanism    string             `yaml:"mechanism" help:"SASL mechanism: empty (none), SCRAM-SHA-256 or SCRAM-SHA-512"`
	Username     string             `yaml:"username" help:"SASL user"`
	Password     tlsconfig.Password `yaml:"password" help:"SASL password (prefer password_file or the environment; never logged)"`
	PasswordFile string             `yaml:"password_file" help:"file holding the SASL password (e.g. a mounted secret)"`
}

func (s SASL) mechanism() (sasl.Mechanism, error) {
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			return nil, errors.New("kafka.sasl.mechanism: a user or password is set but no mechanism; set SCRAM-SHA-256 or SCRAM-SHA-512")
		}
		return nil, nil
	}
	pass, err := tlsconfig.Secret("kafka.sasl.password", s.Password, s.PasswordFile)
	if err != nil {
		return nil, err
	}
	if s.Username == "" {
		return nil, fmt.Errorf("kafka.sasl.username: required with kafka.sasl.mechanism %s", s.Mechanism)
	}
	if pass == "" {
		return nil, fmt.Errorf("kafka.sasl.password: required with kafka.sasl.mechanism %s (or kafka.sasl.password_file)", s.Mechanism)
	}
	auth := scram.Auth{User: s.Username, Pass: pass}
	switch strings.ToUpper(s.Mechanism) {
	case "SCRAM-SHA-256":
		return auth.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return auth.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafka.sasl.mechanism: %q is not supported; use SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
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
	if err := c.TLS.Validate("kafka.tls"); err != nil {
		errs = append(errs, err)
	}
	// Without brokers only the embedded development broker can be meant,
	// and it speaks neither TLS nor SASL: settings meant for a real
	// cluster must not silently meet it.
	if len(c.Brokers) == 0 && (c.TLS.Enabled || c.SASL.Mechanism != "") {
		errs = append(errs, errors.New("kafka.brokers: empty, but kafka.tls or kafka.sasl is set; name the secured cluster's brokers (the embedded development broker takes neither)"))
	}
	if _, err := c.SASL.mechanism(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Options returns the base client options for c followed by extra, so a
// service adds only what is particular to it (producer or consumer group).
// It fails when the TLS files or the SASL password cannot be read.
func (c Config) Options(extra ...kgo.Opt) ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		kgo.DialTimeout(c.DialTimeout),
	}
	tc, err := c.TLS.Build("kafka.tls")
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	m, err := c.SASL.mechanism()
	if err != nil {
		return nil, err
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return append(opts, extra...), nil
}

// NewClient returns a client for c with extra options applied.
func NewClient(c Config, extra ...kgo.Opt) (*kgo.Client, error) {
	if len(c.Brokers) == 0 {
		return nil, errors.New("kafka: no brokers configured; set kafka.brokers (SLUICE_KAFKA_BROKERS)")
	}
	opts, err := c.Options(extra...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new client: %w", err)
	}
	return cl, nil
}

// EnsureTopics creates each missing topic with c's partitions, replication
// factor and [TopicConfigs]. Existing topics are left as they are.
func EnsureTopics(ctx context.Context, cl *kgo.Client, c Config, topics ...string) error {
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopics(ctx, c.Partitions, c.ReplicationFactor, TopicConfigs(ctx, adm, c, nil), topics...)
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

// TopicExists reports whether the brokers of c know topic, without
// creating it.
func TopicExists(ctx context.Context, c Config, topic string) (bool, error) {
	cl, err := NewClient(c)
	if err != nil {
		return false, err
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return false, fmt.Errorf("kafka: list topic %s: %w", topic, err)
	}
	d, ok := details[topic]
	switch {
	case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		return false, nil
	case d.Err != nil:
		return false, fmt.Errorf("kafka: topic %s: %w", topic, d.Err)
	}
	return true, nil
}

// EnsureCompactedTopic creates topic, if missing, as the state topics are
// (the admin topic): compacted, one partition — one record per key is the
// topic's whole meaning, and one partition keeps every record in one order
// that each reader replays alike.
func EnsureCompactedTopic(ctx context.Context, cl *kgo.Client, c Config, topic string) error {
	adm := kadm.NewClient(cl)
	compact := "compact"
	resp, err := adm.CreateTopics(ctx, 1, c.ReplicationFactor, TopicConfigs(ctx, adm, c, map[string]*string{"cleanup.policy": &compact}), topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka: create compacted topic %s: %w", topic, err)
	}
	return nil
}

// MinInsyncReplicas is the min.insync.replicas Sluice sets on a topic it
// creates with replication factor rf when the brokers' own setting is
// brokerMinISR, or 0 to leave the broker's setting in force.
//
// Every Sluice producer writes with acks=all, which means "all in-sync
// replicas" — with min.insync.replicas 1 (Kafka's default) that can be a
// single broker, and an acknowledged event dies with its disk. The rule is
// min(2, rf-1): two copies before an answer once there are three replicas,
// while one broker may still be down (for maintenance) without stopping
// writes; rf 1 and 2 cannot have both, so they keep the broker's setting
// (availability, as with any Kafka default). It never lowers what an
// operator set on the brokers: a value not above brokerMinISR is left out.
func MinInsyncReplicas(rf int16, brokerMinISR int) int {
	want := min(2, int(rf)-1)
	if want <= 1 || want <= brokerMinISR {
		return 0
	}
	return want
}

// TopicConfigs returns base plus the min.insync.replicas [MinInsyncReplicas]
// chooses for a topic created with c, for every place that creates a topic
// (EnsureTopics and the compacted state topics). With replication factor -1
// the brokers' default.replication.factor decides, read from one broker with
// the brokers' min.insync.replicas; when that cannot be read (no
// DescribeConfigs permission, say) the topic gets what the rule gives for a
// configured factor, or nothing for -1 — never an error, since the topic
// itself is still right.
func TopicConfigs(ctx context.Context, adm *kadm.Client, c Config, base map[string]*string) map[string]*string {
	rf, brokerMinISR := c.ReplicationFactor, 1
	if rf == -1 || rf >= 3 {
		defRF, minISR, ok := brokerTopicDefaults(ctx, adm)
		if ok {
			brokerMinISR = minISR
			if rf == -1 {
				rf = defRF
			}
		}
	}
	n := MinInsyncReplicas(rf, brokerMinISR)
	if n == 0 {
		return base
	}
	out := make(map[string]*string, len(base)+1)
	maps.Copy(out, base)
	v := strconv.Itoa(n)
	out["min.insync.replicas"] = &v
	return out
}

// brokerTopicDefaults reads default.replication.factor and
// min.insync.replicas from one broker (a named broker answers with its
// static configuration too; the cluster-wide resource only has dynamic
// values).
func brokerTopicDefaults(ctx context.Context, adm *kadm.Client) (rf int16, minISR int, ok bool) {
	brokers, err := adm.ListBrokers(ctx)
	if err != nil || len(brokers) == 0 {
		return 0, 0, false
	}
	rcs, err := adm.DescribeBrokerConfigs(ctx, brokers[0].NodeID)
	if err != nil || len(rcs) == 0 || rcs[0].Err != nil {
		return 0, 0, false
	}
	var gotRF, gotISR bool
	for _, cfg := range rcs[0].Configs {
		switch cfg.Key {
		case "default.replication.factor":
			if n, err := strconv.ParseInt(cfg.MaybeValue(), 10, 16); err == nil {
				rf, gotRF = int16(n), true
			}
		case "min.insync.replicas":
			if n, err := strconv.Atoi(cfg.MaybeValue()); err == nil {
				minISR, gotISR = n, true
			}
		}
	}
	return rf, minISR, gotRF && gotISR
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

// ReadToEnd polls cl, a client consuming topic, handing each record to
// apply, until it has read every partition up to the end offsets the
// topic has when it is called: a follower of a compacted topic (the admin
// topic's overrides, API keys) knows all of it before it serves.
func ReadToEnd(ctx context.Context, cl *kgo.Client, topic string, apply func(*kgo.Record)) error {
	ends, err := EndOffsets(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		return err
	}
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			remaining[o.Partition] = o.Offset
		}
	})
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kafka: reading %s to its end: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			apply(r)
			if end, ok := remaining[r.Partition]; ok && r.Offset+1 >= end {
				delete(remaining, r.Partition)
			}
		})
	}
	return nil
}

// EndOffsets lists topic's end offsets. A topic created a moment ago (here
// or by another service starting beside this one) can be unknown to the
// broker that answers until metadata has propagated, so it retries on
// UNKNOWN_TOPIC_OR_PARTITION for up to 30 s instead of failing a start-up.
func EndOffsets(ctx context.Context, adm *kadm.Client, topic string) (kadm.ListedOffsets, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err == nil {
			return ends, nil
		}
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || time.Now().After(deadline) {
			return nil, fmt.Errorf("kafka: end offsets of %s: %w", topic, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CommitSync commits offs for cl's consumer group and waits for the
// answer. franz-go reports a refused partition only inside the response
// (the request itself succeeded), so a caller that checks only the error
// would take a refused commit for a stored one; CommitSync returns the
// first refusal, naming its topic and partition, or the request's error.
func CommitSync(ctx context.Context, cl *kgo.Client, offs map[string]map[int32]kgo.EpochOffset) error {
	var cerr error
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		cerr = commitError(req, resp, err)
	})
	return cerr
}

// commitError is the first refusal in a commit's response, or err.
func commitError(req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) error {
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("commit of %s/%d refused: %w", commitTopic(req, t), p.Partition, err)
			}
		}
	}
	return nil
}

// commitTopic names a topic of a commit's response. From OffsetCommit v10
// (Kafka 4) the response carries the topic's id instead of its name; the
// request carries both.
func commitTopic(req *kmsg.OffsetCommitRequest, t kmsg.OffsetCommitResponseTopic) string {
	if t.Topic != "" || req == nil {
		return t.Topic
	}
	for _, rt := range req.Topics {
		if rt.TopicID == t.TopicID && rt.Topic != "" {
			return rt.Topic
		}
	}
	return fmt.Sprintf("topic id %x", t.TopicID)
}

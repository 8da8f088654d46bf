package kafkaconn_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
)

// TestProduceConsumeRealBroker proves the services script's KRaft broker
// takes acks=all idempotent writes and serves them back to a consumer group,
// keyed records landing on one partition in order.
func TestProduceConsumeRealBroker(t *testing.T) {
	cfg := itest.Kafka(t)
	topic := itest.Unique(t, "sluice_test_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	prod, err := kafkaconn.NewClient(cfg, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := kafkaconn.EnsureTopics(ctx, prod, cfg, topic); err != nil {
		t.Fatal(err)
	}
	if err := kafkaconn.EnsureTopics(ctx, prod, cfg, topic); err != nil {
		t.Fatalf("second EnsureTopics must accept the existing topic: %v", err)
	}
	const n = 100
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Key: []byte("tenant-a"), Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	cons, err := kafkaconn.NewClient(cfg, kgo.ConsumeTopics(topic), kgo.ConsumerGroup(topic+"_g"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var got []string
	partition := int32(-1)
	for len(got) < n {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records before timeout", len(got), n)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatal(err) })
		fs.EachRecord(func(r *kgo.Record) {
			if partition >= 0 && r.Partition != partition {
				t.Errorf("same key on partitions %d and %d", partition, r.Partition)
			}
			partition = r.Partition
			got = append(got, string(r.Value))
		})
	}
	for i, v := range got {
		if v != fmt.Sprint(i) {
			t.Fatalf("record %d = %s: keyed records out of order", i, v)
		}
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit offsets: %v", err)
	}
	if err := kafkaconn.Ready(cons)(ctx); err != nil {
		t.Fatalf("ready check against a live broker: %v", err)
	}
}

func TestValidateNamesField(t *testing.T) {
	c := kafkaconn.Defaults()
	c.Brokers = []string{"nohost"}
	c.Partitions = 0
	err := c.Validate()
	for _, want := range []string{"kafka.brokers", "kafka.partitions"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

// TestSCRAMProduceConsume: a client built from kafka.sasl settings (user
// and password_file, SCRAM-SHA-512) creates a topic, produces and consumes
// through the broker's SASL_PLAINTEXT listener.
func TestSCRAMProduceConsume(t *testing.T) {
	cfg := itest.KafkaSCRAM(t)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate() = %v for the services script's SCRAM settings", err)
	}
	topic := itest.Unique(t, "sluice_test_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	prod, err := kafkaconn.NewClient(cfg, kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := kafkaconn.EnsureTopics(ctx, prod, cfg, topic); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := range n {
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: fmt.Appendf(nil, "%d", i)}).FirstErr(); err != nil {
			t.Fatalf("produce over SCRAM: %v", err)
		}
	}
	cons, err := kafkaconn.NewClient(cfg, kgo.ConsumeTopics(topic), kgo.ConsumerGroup(topic+"_g"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	got := 0
	for got < n {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records over SCRAM before timeout", got, n)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatal(err) })
		got += fs.NumRecords()
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit offsets over SCRAM: %v", err)
	}
}

// TestSCRAMWrongPasswordFails: a wrong password is refused by the broker
// with SASL_AUTHENTICATION_FAILED, which the readiness check reports as
// such rather than as a generic network error.
func TestSCRAMWrongPasswordFails(t *testing.T) {
	cfg := itest.KafkaSCRAM(t)
	cfg.SASL.PasswordFile = ""
	cfg.SASL.Password = "not-the-password"
	cl, err := kafkaconn.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = kafkaconn.Ready(cl)(ctx)
	if !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("Ready() with a wrong password = %v, want SASL_AUTHENTICATION_FAILED", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// TestValidateSASLAndTLS: SASL and TLS mistakes are start-up errors naming
// the setting, and a password never appears in them.
func TestValidateSASLAndTLS(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		mut  func(*kafkaconn.Config)
		want string
	}{
		"unknown mechanism": {func(c *kafkaconn.Config) {
			c.SASL = kafkaconn.SASL{Mechanism: "PLAIN", Username: "u", Password: "s3cret"}
		}, "kafka.sasl.mechanism"},
		"user without mechanism": {func(c *kafkaconn.Config) { c.SASL = kafkaconn.SASL{Username: "u", Password: "s3cret"} }, "kafka.sasl.mechanism"},
		"no user":                {func(c *kafkaconn.Config) { c.SASL = kafkaconn.SASL{Mechanism: "SCRAM-SHA-512", Password: "s3cret"} }, "kafka.sasl.username"},
		"no password":            {func(c *kafkaconn.Config) { c.SASL = kafkaconn.SASL{Mechanism: "SCRAM-SHA-256", Username: "u"} }, "kafka.sasl.password"},
		"missing password file": {func(c *kafkaconn.Config) {
			c.SASL = kafkaconn.SASL{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: filepath.Join(dir, "nope")}
		}, "kafka.sasl.password_file"},
		"both password and file": {func(c *kafkaconn.Config) {
			c.SASL = kafkaconn.SASL{Mechanism: "SCRAM-SHA-256", Username: "u", Password: "s3cret", PasswordFile: "/etc/hostname"}
		}, "kafka.sasl.password and kafka.sasl.password_file"},
		"sasl without brokers": {func(c *kafkaconn.Config) {
			c.Brokers = nil
			c.SASL = kafkaconn.SASL{Mechanism: "SCRAM-SHA-512", Username: "u", Password: "s3cret"}
		}, "kafka.brokers: empty"},
		"tls file without enabled": {func(c *kafkaconn.Config) { c.TLS.CAFile = "/etc/hostname" }, "kafka.tls.enabled"},
		"tls ca not pem": {func(c *kafkaconn.Config) {
			c.TLS.Enabled = true
			c.TLS.CAFile = "/etc/hostname"
		}, "kafka.tls.ca_file"},
	} {
		t.Run(name, func(t *testing.T) {
			c := kafkaconn.Defaults()
			c.Brokers = []string{"127.0.0.1:9092"}
			tc.mut(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to name %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
			if _, err := kafkaconn.NewClient(c); err == nil {
				t.Error("NewClient accepted a configuration Validate refuses")
			}
		})
	}
}

func TestMinInsyncReplicasRule(t *testing.T) {
	for _, tc := range []struct {
		rf     int16
		broker int
		want   int
	}{
		{-1, 1, 0}, {1, 1, 0}, {2, 1, 0}, {3, 1, 2}, {5, 1, 2},
		{3, 2, 0}, {5, 3, 0}, {3, 0, 2},
	} {
		if got := kafkaconn.MinInsyncReplicas(tc.rf, tc.broker); got != tc.want {
			t.Errorf("MinInsyncReplicas(rf %d, broker %d) = %d, want %d", tc.rf, tc.broker, got, tc.want)
		}
	}
}

func TestTopicMinInsyncReplicasRealBroker(t *testing.T) {
	cfg := itest.Kafka(t)
	topic := itest.Unique(t, "sluice_isr_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kafkaconn.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, cl, cfg, topic); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	// A topic just created may not be known to the broker answering yet
	// (UNKNOWN_TOPIC_OR_PARTITION for a moment in KRaft).
	var rc kadm.ResourceConfig
	itest.EventuallyNoError(t, 10*time.Second, "the new topic's configuration can be described", func() error {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return err
		}
		if rc, err = rcs.On(topic, nil); err != nil {
			return err
		}
		return rc.Err
	})
	for _, c := range rc.Configs {
		if c.Key == "min.insync.replicas" && c.Source == kmsg.ConfigSourceDynamicTopicConfig && c.MaybeValue() != "1" {
			t.Errorf("RF 1 topic has min.insync.replicas=%s of its own; no write could succeed", c.MaybeValue())
		}
	}

	compact := "compact"
	three := cfg
	three.ReplicationFactor = 3
	got := kafkaconn.TopicConfigs(ctx, adm, three, map[string]*string{"cleanup.policy": &compact})
	if v := got["min.insync.replicas"]; v == nil || *v != "2" {
		t.Errorf("RF 3: min.insync.replicas = %v, want 2", v)
	}
	if v := got["cleanup.policy"]; v == nil || *v != "compact" {
		t.Errorf("RF 3: cleanup.policy lost: %v", got)
	}
	if got := kafkaconn.TopicConfigs(ctx, adm, cfg, nil); got["min.insync.replicas"] != nil {
		t.Errorf("broker-default RF (1 here): min.insync.replicas = %s, want none", *got["min.insync.replicas"])
	}
}

func TestBrokerTopicDefaultsRealBroker(t *testing.T) {
	cfg := itest.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kafkaconn.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rf, minISR, ok := kafkaconn.BrokerTopicDefaults(ctx, kadm.NewClient(cl))
	if !ok || rf != 1 || minISR < 1 {
		t.Fatalf("brokerTopicDefaults = rf %d, min.insync.replicas %d, ok %v; want rf 1 from the test broker", rf, minISR, ok)
	}
}

// TestCommitSyncReportsRefusals: a commit the broker refuses for one
// partition must come back as an error naming it, not as success (the
// request itself succeeds; the refusal is inside the response), and a
// commit it accepts must be stored.
func TestCommitSyncReportsRefusals(t *testing.T) {
	cfg := itest.Kafka(t)
	topic := itest.Unique(t, "sluice_test_")
	group := topic + "_g"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kafkaconn.NewClient(cfg, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, cl, cfg, topic); err != nil {
		t.Fatal(err)
	}

	// A topic just created may be unknown to the group coordinator for a
	// moment (the broker's metadata catches up): the commit is refused
	// with UNKNOWN_TOPIC_OR_PARTITION until then, as CommitSync reports.
	itest.EventuallyNoError(t, 30*time.Second, "commit of an existing partition", func() error {
		return kafkaconn.CommitSync(ctx, cl, map[string]map[int32]kgo.EpochOffset{topic: {0: {Epoch: -1, Offset: 7}}})
	})
	got, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := got.Lookup(topic, 0); !ok || o.At != 7 {
		t.Fatalf("committed offset of %s/0 = %+v (found %v), want 7", topic, o, ok)
	}

	err = kafkaconn.CommitSync(ctx, cl, map[string]map[int32]kgo.EpochOffset{topic: {999: {Epoch: -1, Offset: 1}}})
	if !errors.Is(err, kerr.UnknownTopicOrPartition) || !strings.Contains(err.Error(), fmt.Sprintf("%s/999", topic)) {
		t.Fatalf("commit of a partition the topic lacks: err = %v, want UNKNOWN_TOPIC_OR_PARTITION naming %s/999", err, topic)
	}
}

package kafkaconn_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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

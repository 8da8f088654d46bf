package itest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
)

// CompactingTopic creates topic with one partition, compacted as
// aggressively as the broker allows: segments roll every 100 ms, any
// dirty ratio is worth a pass, tombstones go at once. The broker's cleaner
// then compacts within its back-off (15 s by default) of a segment roll.
// It returns a client of the topic's; both go when t ends.
func CompactingTopic(t testing.TB, kc kafkaconn.Config, topic string) *kgo.Client {
	t.Helper()
	cl, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	s := func(v string) *string { return &v }
	if _, err := adm.CreateTopic(context.Background(), 1, 1, map[string]*string{"cleanup.policy": s("compact"), "segment.ms": s("100"),
		"min.cleanable.dirty.ratio": s("0.001"), "delete.retention.ms": s("0"), "min.compaction.lag.ms": s("0"),
		"max.compaction.lag.ms": s("100")}, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })
	return cl
}

// WaitCompacted produces a record to the CompactingTopic topic through
// prod every few seconds (so the active segment rolls) until the broker's
// cleaner removed the first of the two records keyed canary: everything
// produced before the second was then compacted.
func WaitCompacted(t testing.TB, kc kafkaconn.Config, prod *kgo.Client, topic, canary string) {
	t.Helper()
	ctx := context.Background()
	Eventually(t, 90*time.Second, "the broker compacting "+topic, func() bool {
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("roll"), Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		rd, err := kafkaconn.NewClient(kc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		n := 0
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		for rctx.Err() == nil {
			for _, r := range rd.PollFetches(rctx).Records() {
				if string(r.Key) == canary {
					n++
				}
				if string(r.Key) == "roll" {
					cancel() // the roll records come after both canaries
				}
			}
		}
		return n == 1
	})
}

// ReadTopic returns every record of topic below its end offsets at the
// time of the call, in partition order: all that was produced and
// acknowledged before it. It fails t when the topic cannot be read to
// those offsets within 60 s.
func ReadTopic(t testing.TB, kc kafkaconn.Config, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kafkaconn.NewClient(kc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kafkaconn.EndOffsets(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []*kgo.Record
	err = kafkaconn.ReadToEnd(ctx, cl, topic, func(r *kgo.Record) {
		// ReadToEnd may go past the ends listed above (it lists them
		// again); what came after the call is not the caller's.
		if end, ok := ends.Lookup(topic, r.Partition); ok && r.Offset < end.Offset {
			out = append(out, r)
		}
	})
	if err != nil {
		t.Fatalf("read %s: %v", topic, err)
	}
	return out
}

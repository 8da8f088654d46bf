package itest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
)

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

package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
)

// TestPartitionsRaisesATopicsCount: the command docs/scaling.md gives for
// adding partitions works against the broker scripts/services.sh runs
// (which has no kafka-topics.sh): it shows the count, raises it, and
// refuses to lower it, naming both counts.
func TestPartitionsRaisesATopicsCount(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	kc := itest.Kafka(t)
	kc.Partitions = 2
	topic := itest.Unique(t, "usage_")
	cl, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := kafkaconn.EnsureTopics(ctx, cl, kc, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), topic) })
	// A broker answers CreateTopics and CreatePartitions before its
	// metadata lists the change: each step is checked once it is listed,
	// as an operator's next command would be.
	listed := func(n int) {
		t.Helper()
		itest.EventuallyNoError(t, time.Minute, fmt.Sprintf("the topic listed with %d partitions", n), func() error {
			td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
			if err != nil {
				return err
			}
			if tp, ok := td[topic]; !ok || tp.Err != nil || len(tp.Partitions) != n {
				return fmt.Errorf("listed as %+v", td[topic])
			}
			return nil
		})
	}
	listed(2)
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := runPartitionsTo(ctx, append([]string{"-kafka.brokers", strings.Join(kc.Brokers, ","), "-topic", topic}, args...), &out)
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "2 partitions") {
		t.Fatalf("show: %q, %v", out, err)
	}
	if out, err := run("-count", "4"); err != nil || !strings.Contains(out, "4 partitions (was 2)") {
		t.Fatalf("raise: %q, %v", out, err)
	}
	listed(4)
	if _, err := run("-count", "3"); err == nil || !strings.Contains(err.Error(), "3 is below the 4 partitions") {
		t.Fatalf("lowering: %v", err)
	}
}

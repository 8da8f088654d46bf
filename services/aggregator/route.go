package aggregator

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// Direct producers and the home partition (docs/producers.md).
//
// The aggregator keeps a tenant's counters in the state of one partition,
// so every event of a tenant must be counted on the same one: its home,
// murmur2(tenant) mod partitions, what Kafka's Java client, franz-go's
// key partitioner (ingest, the SDK's KafkaSender) and most Go and JVM
// clients choose for key = tenant. Clients built on librdkafka (kcat,
// confluent-kafka-python, most non-Go clients) hash keys with CRC32 by
// default and put a tenant elsewhere; left there, two partitions' states
// would each count part of the tenant and overwrite each other's
// quota_state rows. So a record found off its tenant's home is not counted
// where it is: the aggregator produces it again to the home partition
// (header HeaderReroutedFrom naming where it came from) before committing
// past it, and counts it there. A crash between the two re-produces it;
// the home partition's dedup by id counts it once.

// HeaderReroutedFrom is set on a usage record the aggregator moved to its
// tenant's home partition: "partition/offset" of the original record.
const HeaderReroutedFrom = "sluice-rerouted-from"

// keyHasher is franz-go's Kafka-compatible key partitioner (murmur2, as
// Java's default), used for records with a key only, where it is a pure
// function of key and partition count.
var keyHasher = kgo.StickyKeyPartitioner(nil).ForTopic("")

// homePartition returns the partition a tenant's events are counted on
// when the topic has n partitions.
func homePartition(tenant string, n int) int32 {
	return int32(keyHasher.Partition(&kgo.Record{Key: []byte(tenant)}, n))
}

// partitioner sends usage records to the partition the aggregator set
// (re-routing) and keys everything else by its key, as ingest does.
func (a *aggregator) partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		if topic == a.topics.Usage {
			return func(r *kgo.Record, _ int) int { return int(r.Partition) }
		}
		return func(r *kgo.Record, n int) int { return keyHasher.Partition(r, n) }
	})
}

// home reports the home partition of tenant, or ok false while the
// topic's partition count is not known yet.
func (a *aggregator) home(tenant string) (int32, bool) {
	n := a.nparts.Load()
	if n <= 0 {
		return 0, false
	}
	return homePartition(tenant, int(n)), true
}

// refreshPartitions reads the usage topic's partition count, which
// decides every tenant's home partition. The caller holds mu.
func (a *aggregator) refreshPartitions(ctx context.Context, adm *kadm.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tds, err := adm.ListTopics(ctx, a.topics.Usage)
	if err != nil {
		return err
	}
	td, ok := tds[a.topics.Usage]
	if !ok || td.Err != nil {
		return fmt.Errorf("topic %s: metadata: %v", a.topics.Usage, td.Err)
	}
	n := int32(len(td.Partitions))
	if old := a.nparts.Load(); old > 0 && old != n {
		// What was counted under the old count goes out versioned with
		// it: a batch flushed after the swap would carry the new count
		// above its old home's offsets, and a moved tenant's rows from its
		// old home would beat those of its new one for good.
		if err := a.flushAll(ctx); err != nil {
			return fmt.Errorf("flush before the partition count changes from %d to %d: %w", old, n, err)
		}
	}
	if old := a.nparts.Swap(n); old != n {
		if old > 0 {
			// And at once a batch of every partition under the new count,
			// empty if need be: its commit tells the moved tenants' new
			// homes that what this instance counted under the old count is
			// stored (handover.go). A failure (a cancelled ctx) leaves it
			// to the next flush.
			_ = a.flushAll(ctx)
		}
		a.log.Info("usage topic partition count", "topic", a.topics.Usage, "partitions", n, "before", old)
		if old > 0 {
			// Tenants whose home moved are rebuilt on their new home from
			// what the old one stored (mayHaveMoved); the consumer learns
			// of the new partitions now rather than at its next metadata
			// refresh.
			a.pastCounts[int(old)] = true
			a.cl.ForceMetadataRefresh()
		}
	}
	return nil
}

// schemaOK reports whether rec names the usage event v1 schema in its
// schema header. A record without it, or naming another schema (a v2
// record on the v1 topic), is not counted: its value may not mean what v1
// says, and counting wrong tokens is worse than not counting them.
func schemaOK(rec *kgo.Record) bool {
	for _, h := range rec.Headers {
		if h.Key == schemas.HeaderSchema {
			return bytes.Equal(h.Value, schemaUsageV1)
		}
	}
	return false
}

var schemaUsageV1 = []byte(schemas.SchemaUsageV1)

// reroute queues rec for its tenant's home partition.
func (a *aggregator) reroute(p *partition, rec *kgo.Record, tenant string, home int32) {
	hs := []kgo.RecordHeader{
		{Key: schemas.HeaderSchema, Value: schemaUsageV1},
		{Key: HeaderReroutedFrom, Value: []byte(strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10))},
	}
	// The event's trace context goes with it (docs/tracing.md).
	for _, h := range rec.Headers {
		if h.Key == traceprop.TraceParent || h.Key == traceprop.TraceState {
			hs = append(hs, h)
		}
	}
	p.reroutes = append(p.reroutes, &kgo.Record{Topic: a.topics.Usage, Partition: home, Key: []byte(tenant), Value: rec.Value, Headers: hs})
	a.m.rerouted.Inc()
}

// partitionsRefresh is how often the poll loop re-reads the usage topic's
// partition count.
const partitionsRefresh = 10 * time.Second

// oldHomes returns the partitions other than part on which tenant, new to
// part, may have been counted under an earlier partition count of the
// topic, so that its state must be rebuilt from what they stored — once
// they stored all of it (handover.go) — before its first event here is
// counted; none for a tenant that never moved. Partition counts only grow;
// those used are recorded in the versions of quota_state rows
// (chstore.VersionShift) and in pastCounts as they change. The caller
// holds mu.
func (a *aggregator) oldHomes(tenant string, part int32) []int32 {
	n := int(a.nparts.Load())
	var out []int32
	for c := range a.pastCounts {
		if c <= 0 || c == n {
			continue
		}
		if q := homePartition(tenant, c); q != part && !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	return out
}

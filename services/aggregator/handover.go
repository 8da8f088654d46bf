package aggregator

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Hand-over of moved tenants when the usage topic gains partitions.
//
// A tenant is counted on its home, murmur2(tenant) mod the partition
// count (route.go). Adding partitions moves about half the tenants, and
// every instance learns the new count on its own (partitionsRefresh, or at
// an assignment), so for a while a moved tenant's old home — another
// instance, or this one a few seconds behind — still counts it under the
// old count, and what it counted reaches ClickHouse only when its writer
// stores the batch. The new home rebuilds the tenant from ClickHouse
// (chstore.ReplayTenant) before its first event there; done too early,
// that rebuild misses what the old home counted but had not stored yet,
// and the new home's counters and quota_state rows stay short for good.
//
// The hand-over closes that window with the group's committed offsets:
//
//   - Every commit names, in its metadata ("sluice-partitions=N"), the
//     partition count under which the committed batch was drained. A
//     partition's writer stores batches in order and commits after
//     storing, so a commit made under count N means: everything its owner
//     counted under any earlier count is in ClickHouse. Under N it counts
//     no tenant that N moved away (those records are re-routed).
//   - When an instance adopts a new count it flushes what it counted under
//     the old one (refreshPartitions), then flushes again, so that every
//     partition it owns commits under the new count even with no new event
//     (drain queues a commit-only batch when a partition's last batch was
//     drained under another count). A newly assigned partition does the
//     same at its first flush: its new owner resumes at the committed
//     offset under the current count and re-routes whatever the previous
//     owner read past it, so nothing more is counted there for the moved
//     tenants.
//   - The new home, at the first event of a tenant that may have moved
//     (oldHomes), restores it only once every old home committed under the
//     current count (handedOver). Until then it stops that partition at the
//     event: the record is not processed, the partition's fetching is paused
//     and rewound to it, and the poll loop re-reads the group's committed
//     offsets every handoverPoll (checkHandovers). The partition's other
//     tenants wait with it — adding partitions is rare, and the wait is
//     bounded by the old owner's next refresh (partitionsRefresh), a flush
//     and a ClickHouse write, or, if that owner died, by the session timeout
//     and its successor's rebuild.
//   - An old home that never commits under the new count (an instance of a
//     release without hand-over during a rolling upgrade, or one stalled on
//     ClickHouse) must not stop the new home for ever: after
//     handoverMaxWait its old homes are taken as handed over (so the other
//     tenants they had wait no longer) and the tenant is restored from what
//     ClickHouse holds, as before the hand-over existed, logged and counted
//     (sluice_aggregator_handover_wait_seconds{result="timeout"}); the
//     reconciler repairs what that leaves short.
//
// Remaining gap, not handled: an event held for being stamped beyond
// max_event_future on the old home when the count changes is counted there
// on release, under the new count, after the hand-over.

// handoverMetaPrefix starts the offset-commit metadata of the usage topic.
const handoverMetaPrefix = "sluice-partitions="

// handoverPoll is how often a poll loop with a partition waiting for a
// hand-over re-reads the group's committed offsets.
const handoverPoll = 500 * time.Millisecond

// handoverMaxWait bounds a partition's wait for a hand-over (see above).
const handoverMaxWait = 2 * time.Minute

// handoverWait is a partition stopped at a moved tenant's first event
// until the tenant's old homes committed under partition count count.
type handoverWait struct {
	tenant string
	from   []int32
	count  int32
	offset int64
	since  time.Time
}

// commitMetadata is the offset-commit metadata of a batch drained under
// partition count n.
func commitMetadata(n int32) string { return handoverMetaPrefix + strconv.Itoa(int(n)) }

// commitCount parses commitMetadata; 0 for anything else (a commit of an
// earlier release, or of another tool).
func commitCount(meta string) int32 {
	n, err := strconv.Atoi(strings.TrimPrefix(meta, handoverMetaPrefix))
	if err != nil || !strings.HasPrefix(meta, handoverMetaPrefix) || n < 0 {
		return 0
	}
	return int32(n)
}

// withCommitMetadata returns ctx for committing partition part of the
// usage topic with the metadata of partition count n.
func (a *aggregator) withCommitMetadata(ctx context.Context, part, n int32) context.Context {
	meta := commitMetadata(n)
	return kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			if req.Topics[i].Topic != a.topics.Usage {
				continue
			}
			for j := range req.Topics[i].Partitions {
				if req.Topics[i].Partitions[j].Partition == part {
					req.Topics[i].Partitions[j].Metadata = &meta
				}
			}
		}
		return nil
	})
}

// handedOver reports whether every partition of from committed under
// partition count n or a later one, as last read. The caller holds mu.
func (a *aggregator) handedOver(from []int32, n int32) bool {
	for _, q := range from {
		if a.commitCounts[q] < n {
			return false
		}
	}
	return true
}

// awaitHandover stops p at the record at offset, the first of tenant, until
// its old homes from have handed it over: the record is not processed,
// and p is paused and rewound to it. The caller holds mu, runs on the poll
// goroutine before AllowRebalance (SetOffsets wants no revoke running),
// and stops processing p's records.
func (a *aggregator) awaitHandover(p *partition, tenant string, from []int32, offset int64) {
	n := a.nparts.Load()
	a.waiting[p.id] = &handoverWait{tenant: tenant, from: from, count: n, offset: offset, since: time.Now()}
	a.cl.PauseFetchPartitions(map[string][]int32{a.topics.Usage: {p.id}})
	a.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{a.topics.Usage: {p.id: {Epoch: -1, Offset: offset}}})
	a.log.Info("partition waits for a moved tenant's old home to store what it counted under the old partition count",
		"partition", p.id, "tenant", tenant, "old_homes", from, "partitions", n, "offset", offset)
}

// mayRestoreMoved reports whether tenant, new to p and possibly counted
// under an earlier partition count on the partitions from, may be
// restored now; if not, it stops p (awaitHandover) and the caller stops
// processing p's records. The caller holds mu.
func (a *aggregator) mayRestoreMoved(p *partition, tenant string, from []int32, offset int64) bool {
	if a.handedOver(from, a.nparts.Load()) {
		return true
	}
	a.awaitHandover(p, tenant, from, offset)
	return false
}

// readCommitCounts returns the partition count of every usage partition's
// last commit in the group, when a partition waits for a hand-over and the
// last read is handoverPoll old; nil otherwise. The poll loop calls it
// before polling, without mu (it asks the broker).
func (a *aggregator) readCommitCounts(ctx context.Context) map[int32]int32 {
	a.mu.Lock()
	waiting := len(a.waiting) > 0
	a.mu.Unlock()
	if !waiting || time.Since(a.lastHandoverRead) < handoverPoll {
		return nil
	}
	a.lastHandoverRead = time.Now()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(a.cl).FetchOffsets(rctx, a.cfg.Group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("reading the group's committed offsets for a hand-over failed; retrying", "err", err)
		}
		return nil
	}
	out := map[int32]int32{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == a.topics.Usage && o.Err == nil {
			out[o.Partition] = commitCount(o.Metadata)
		}
	})
	return out
}

// resumeHandovers records counts (from readCommitCounts) and fetches again
// every waiting partition whose old homes handed over, or whose wait
// expired: then its old homes count as handed over from now on. The caller
// holds mu and runs on the poll goroutine after a poll and before
// AllowRebalance.
func (a *aggregator) resumeHandovers(counts map[int32]int32) {
	for q, n := range counts {
		// Counts only grow; a stale read must not take one back.
		a.commitCounts[q] = max(a.commitCounts[q], n)
	}
	for id, w := range a.waiting {
		done := a.handedOver(w.from, a.nparts.Load())
		if !done && time.Since(w.since) < handoverMaxWait {
			continue
		}
		delete(a.waiting, id)
		if done {
			a.m.handoverWaits.WithLabelValues("handed_over").Observe(time.Since(w.since).Seconds())
			a.log.Info("moved tenant handed over; partition fetched again", "partition", id, "tenant", w.tenant, "waited", time.Since(w.since).Round(time.Millisecond))
		} else {
			for _, q := range w.from {
				a.commitCounts[q] = max(a.commitCounts[q], w.count)
			}
			a.m.handoverWaits.WithLabelValues("timeout").Observe(time.Since(w.since).Seconds())
			a.log.Warn("a moved tenant's old home did not commit under the new partition count in time; restoring the tenant from what ClickHouse holds, which may miss what the old home has not stored yet (the reconciler repairs it)",
				"partition", id, "tenant", w.tenant, "old_homes", w.from, "partitions", w.count, "waited", time.Since(w.since).Round(time.Second))
		}
		if p := a.parts[id]; p != nil {
			a.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{a.topics.Usage: {id: {Epoch: -1, Offset: p.next}}})
		}
		a.cl.ResumeFetchPartitions(map[string][]int32{a.topics.Usage: {id}})
	}
}

// dropHandovers forgets the waits of partitions this instance no longer
// owns and un-pauses them, so that a later assignment fetches them. The
// caller holds mu.
func (a *aggregator) dropHandovers(parts []int32) {
	for _, id := range parts {
		if a.waiting[id] != nil {
			delete(a.waiting, id)
			a.cl.ResumeFetchPartitions(map[string][]int32{a.topics.Usage: {id}})
		}
	}
}

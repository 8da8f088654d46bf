package enforcer

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
)

// Signal offsets are committed only once what those signals changed is
// in Redis. The consumer group's offsets are where a restarted replica
// resumes; Redis flags are its floor (recovery.go). A signal committed
// before its flag was written — as auto-commit did, at poll time — is lost
// for good by a crash in between: ClickHouse gives quota breakers back,
// but an anomaly (error ratio, slow calls) or rate breaker it opened is in
// neither place.
//
//   - The leader commits, for each partition, the offset after the records
//     it had handled when a flag flush that succeeded began (the writer's
//     OnFlush): everything they marked dirty was in that flush, or in an
//     earlier one that succeeded, or in the full rewrite a failed one
//     scheduled.
//   - A follower writes no flags: the leader writes what every replica
//     reads. It commits no further than the leader's own consumer group
//     (consumer_group-<leader's replica_id>, which the leader commits as
//     above) nor than it has handled itself. A follower of an unknown
//     leader, or without replica_id, commits nothing.
//   - Offsets are committed every commitEvery and once more at shutdown,
//     after the writer's last flush; never backwards.
//
// What this does not keep: a breaker hidden under a more severe one on
// the same flag field has no flag of its own, so a restart loses it as
// before (README.md, "Where its state comes from").

// commitEvery is how often durable signal offsets are committed.
const commitEvery = time.Second

// signalOffsets tracks, per partition of the signals topic, what the core
// handled, what of it is durable in Redis, and what is committed.
type signalOffsets struct {
	mu        sync.Mutex
	assigned  map[int32]bool            // the partitions the group gives this replica now
	applied   map[int32]kgo.EpochOffset // after the last record handled
	durable   map[int32]kgo.EpochOffset // applied as the last successful flush began
	committed map[int32]int64
	// commitMu serializes commits with the revocation of partitions, so
	// that no commit lands for a partition this replica no longer owns.
	commitMu sync.Mutex
	errors   prometheus.Counter
}

func newSignalOffsets() *signalOffsets {
	return &signalOffsets{assigned: map[int32]bool{}, applied: map[int32]kgo.EpochOffset{}, durable: map[int32]kgo.EpochOffset{}, committed: map[int32]int64{},
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_enforcer_signal_commit_errors_total",
			Help: "Commits of signal offsets (made once their flags are in Redis) that Kafka refused; the next one commits again, and a restart meanwhile re-reads the signals since the last commit."})}
}

// handled records that every record of partition p before next was
// handled (applied to the table, its tenants marked dirty). Records of a
// partition revoked while they were handled are not recorded: no commit
// may follow for a partition another member owns.
func (o *signalOffsets) handled(p int32, next int64, epoch int32) {
	o.mu.Lock()
	if o.assigned[p] {
		o.applied[p] = kgo.EpochOffset{Epoch: epoch, Offset: next}
	}
	o.mu.Unlock()
}

// assign records partitions the group gave this replica.
func (o *signalOffsets) assign(parts []int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		o.assigned[p] = true
	}
}

// onFlush is the flag writer's OnFlush: what is handled now is durable
// once the flush that begins succeeds.
func (o *signalOffsets) onFlush() func() {
	o.mu.Lock()
	snap := make(map[int32]kgo.EpochOffset, len(o.applied))
	for p, eo := range o.applied {
		snap[p] = eo
	}
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		for p, eo := range snap {
			if _, owned := o.applied[p]; owned && eo.Offset > o.durable[p].Offset {
				o.durable[p] = eo
			}
		}
		o.mu.Unlock()
	}
}

// leaderCommittable returns the durable offsets not committed yet.
func (o *signalOffsets) leaderCommittable() map[int32]kgo.EpochOffset {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int32]kgo.EpochOffset{}
	for p, eo := range o.durable {
		if eo.Offset > o.committed[p] {
			out[p] = eo
		}
	}
	return out
}

// followerCommittable returns, for each partition, the lower of what was
// handled here and what the leader committed (leader), where that is
// ahead of this replica's last commit.
func (o *signalOffsets) followerCommittable(leader map[int32]int64) map[int32]kgo.EpochOffset {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int32]kgo.EpochOffset{}
	for p, eo := range o.applied {
		l, ok := leader[p]
		if !ok {
			continue
		}
		if at := min(eo.Offset, l); at > o.committed[p] {
			out[p] = kgo.EpochOffset{Epoch: -1, Offset: at}
		}
	}
	return out
}

// forget drops partitions this replica no longer owns.
func (o *signalOffsets) forget(parts []int32) {
	o.commitMu.Lock()
	defer o.commitMu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		delete(o.assigned, p)
		delete(o.applied, p)
		delete(o.durable, p)
		delete(o.committed, p)
	}
}

// groupCallbacks are the consumer-group options that keep o to the
// partitions assigned.
func (o *signalOffsets) groupCallbacks(topic string) []kgo.Opt {
	drop := func(_ context.Context, _ *kgo.Client, parts map[string][]int32) { o.forget(parts[topic]) }
	return []kgo.Opt{kgo.DisableAutoCommit(), kgo.OnPartitionsRevoked(drop), kgo.OnPartitionsLost(drop),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) { o.assign(parts[topic]) })}
}

// runCommits commits durable signal offsets every commitEvery until ctx
// ends, then once more after the writer's last flush (writerDone).
func (c *core) runCommits(ctx context.Context, kc *kgo.Client, writerDone <-chan struct{}) error {
	t := time.NewTicker(commitEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			select {
			case <-writerDone:
			case <-time.After(c.cfg.ShutdownTimeout):
			}
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c.commitDurable(cctx, kc)
			cancel()
			return nil
		case <-t.C:
			c.commitDurable(ctx, kc)
		}
	}
}

// commitDurable commits what is durable now (see above).
func (c *core) commitDurable(ctx context.Context, kc *kgo.Client) {
	var offs map[int32]kgo.EpochOffset
	if c.writer.Leading() {
		offs = c.offsets.leaderCommittable()
	} else if leader, ok := c.leaderCommitted(ctx, kc); ok {
		offs = c.offsets.followerCommittable(leader)
	}
	if len(offs) == 0 {
		return
	}
	o := c.offsets
	o.commitMu.Lock()
	defer o.commitMu.Unlock()
	o.mu.Lock()
	for p := range offs {
		if _, owned := o.applied[p]; !owned {
			delete(offs, p) // revoked since
		}
	}
	o.mu.Unlock()
	if len(offs) == 0 {
		return
	}
	if err := kafkaconn.CommitSync(ctx, kc, map[string]map[int32]kgo.EpochOffset{c.signalsTopic: offs}); err != nil {
		o.errors.Inc()
		if ctx.Err() == nil {
			c.log.Warn("enforcer: committing signal offsets failed; the next commit retries", "err", err)
		}
		return
	}
	o.mu.Lock()
	for p, eo := range offs {
		o.committed[p] = max(o.committed[p], eo.Offset)
	}
	o.mu.Unlock()
}

// leaderCommitted returns the signal offsets the current leader's
// consumer group committed, when this replica knows the leader and runs
// with replica_id (so that the leader's group is consumer_group-<id>).
func (c *core) leaderCommitted(ctx context.Context, kc *kgo.Client) (map[int32]int64, bool) {
	holder, _ := c.leaseHolder.Load().(string)
	id, _, ok := strings.Cut(holder, "/")
	if !ok || id == "" || c.cfg.ReplicaID == "" || id == c.cfg.ReplicaID {
		return nil, false
	}
	rctx, cancel := context.WithTimeout(ctx, commitEvery)
	defer cancel()
	offs, err := kadm.NewClient(kc).FetchOffsets(rctx, c.cfg.Group+"-"+id)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		c.log.Debug("enforcer: reading the leader's committed signal offsets failed", "leader", id, "err", err)
		return nil, false
	}
	out := map[int32]int64{}
	offs.Each(func(r kadm.OffsetResponse) {
		if r.Topic == c.signalsTopic && r.Err == nil && r.At >= 0 {
			out[r.Partition] = r.At
		}
	})
	return out, true
}

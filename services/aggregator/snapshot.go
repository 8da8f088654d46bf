package aggregator

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Snapshots (services.aggregator.snapshot_interval).
//
// Every interval a partition's state is snapshotted right after a drain
// (snapshot) and stored by its writer after the batches it covers and
// before their offset is committed (writer.go, storeSnapshot); once an
// offset at or past it is committed, the older snapshots of the partition
// are dropped (a restart at the committed offset no longer needs them;
// until then, a refused commit leaves the previous one in use).
//
// The encoding (about 5.5 s per 1,000,000 tenant × model keys) runs on a
// goroutine of its own, not in the poll loop: the partition is frozen
// meanwhile — not fetched, its state left alone by the poll loop
// (process, drain, evictIdle skip it; a policy reload or an override
// waits for the encoding to end) — and thawed by the first poll after it
// ends (thawSnapshots). So the snapshot is exactly the state at the
// drained offset, no copy of the state is made, and the instance's other
// partitions keep flowing; only the snapshotted partition's events wait,
// for as long as its own state takes to encode.
// A newly assigned partition loads the newest snapshot at or below its
// committed offset taken under the policy in force, and replays only the
// events stored since; with no such snapshot, or a damaged one, or after
// the topic gained partitions (moved tenants' events are on other
// partitions), it rebuilds in full, logged and counted in
// sluice_aggregator_snapshot_fallbacks_total{reason}.

// loadSnapshot restores partition id, committed at before, from its
// newest usable snapshot and the events stored since. It reports false
// (and the caller rebuilds in full) when snapshots are off or none is
// usable.
func (a *aggregator) loadSnapshot(ctx context.Context, id int32, before int64) (*tally.Partition, int, bool) {
	if a.cfg.SnapshotInterval <= 0 {
		return nil, 0, false
	}
	fallback := func(reason string, err error) (*tally.Partition, int, bool) {
		a.m.snapshotFallbacks.WithLabelValues(reason).Inc()
		if reason == "none" {
			a.log.Info("no snapshot of the partition stored: rebuilding from the events", "partition", id, "resume_offset", before)
		} else {
			a.log.Warn("partition snapshot not usable: rebuilding from the events", "partition", id, "resume_offset", before, "reason", reason, "err", err)
		}
		return nil, 0, false
	}
	n := int(a.nparts.Load())
	for c := range a.pastCounts {
		if c != 0 && c != n {
			return fallback("repartitioned", nil)
		}
	}
	now := time.Now()
	st, replayed, err := a.store.LoadPartition(ctx, id, before, a.cfg.options(), a.watcher.Current(), func(st *tally.Partition) {
		st.SetClock(now)
		for _, tn := range st.OverriddenTenants() {
			st.SetOverrides(tn, nil) // lifted since the snapshot unless installed again below
		}
		a.installOverrides(st, now)
	})
	switch {
	case errors.Is(err, chstore.ErrNoSnapshot):
		return fallback("none", err)
	case errors.Is(err, tally.ErrSnapshotMismatch):
		return fallback("mismatch", err)
	case errors.Is(err, tally.ErrSnapshotCorrupt):
		return fallback("corrupt", err)
	case err != nil:
		return fallback("error", err)
	}
	return st, replayed, true
}

// snappedAt is the snapNext of a partition assigned at offset before
// whose state replayed events stored after its snapshot (or without one):
// before when it replayed none, so that an idle partition is not
// snapshotted again; otherwise -1, below every offset, so that the next
// snapshot (at the interval or at the stop) is taken even if nothing new
// is read, and the next restart does not replay the same events again.
func snappedAt(before int64, replayed int) int64 {
	if replayed > 0 {
		return -1
	}
	return before
}

// snapTask is a snapshot being encoded from a frozen partition state.
type snapTask struct {
	done chan struct{} // closed when data or err is set
	fp   string        // the policy fingerprint it is taken under
	data []byte
	err  error
	took time.Duration
}

// snapshotDue reports whether p's state should be snapshotted at the next
// flush: the interval has passed, events were read since the last
// snapshot, none is being encoded, no tenant is being restored (its events
// are parked, not in the state) and the partition does not wait for a
// hand-over.
func (a *aggregator) snapshotDue(p *partition) bool {
	return a.snapshotWanted(p) && time.Since(p.snapAt) >= a.cfg.SnapshotInterval
}

// snapshotWanted reports whether p's state, as it stands, is worth a
// snapshot and may be taken: snapshots are on, events were read since the
// last one, none is being encoded, and every event read is in the state.
func (a *aggregator) snapshotWanted(p *partition) bool {
	return a.cfg.SnapshotInterval > 0 && p.snap == nil && p.next > p.snapNext &&
		len(p.restoring) == 0 && p.parked == 0 && a.waiting[p.id] == nil
}

// snapshotsDue reports whether any partition's snapshot is due, so that
// the poll loop flushes for it even when no event is pending.
func (a *aggregator) snapshotsDue() bool {
	for _, p := range a.parts {
		if a.snapshotDue(p) {
			return true
		}
	}
	return false
}

// snapshot attaches a snapshot of p's state to j when one is due. The
// state has just been drained, so it holds exactly the events below
// j.next; it is frozen (p.snap, p's fetching paused) and encoded on a
// goroutine, and the writer stores it once encoded, after j's rows and
// before the commit, so a snapshot never covers an event ClickHouse
// lacks. None is taken while tenants are being restored (their events
// are parked, not in the state) or while the policy in force is not yet
// the state's.
func (a *aggregator) snapshot(p *partition, j *job) {
	if !a.snapshotDue(p) || j.next != p.next {
		return
	}
	pol := a.watcher.Current()
	if p.state.Policy() != pol {
		return
	}
	start := time.Now()
	p.snapAt, p.snapNext = start, j.next
	task := &snapTask{done: make(chan struct{}), fp: pol.Fingerprint()}
	a.cl.PauseFetchPartitions(map[string][]int32{a.cfg.Topic: {p.id}})
	p.snap, j.snap = task, task
	st, size := p.state, p.snapLen+p.snapLen/8
	go func() {
		begin := time.Now()
		task.data, task.err = st.Snapshot(make([]byte, 0, size), task.fp)
		task.took = time.Since(begin)
		close(task.done)
		a.kickPoll() // thaw the partition without waiting out the poll
	}()
	a.m.snapshotPause.Observe(time.Since(start).Seconds())
}

// thawSnapshots resumes fetching every partition whose snapshot is
// encoded, from the offset its state reached. The caller holds mu and
// runs on the poll goroutine after a poll and before AllowRebalance
// (SetOffsets wants no revoke running).
func (a *aggregator) thawSnapshots() {
	for id, p := range a.parts {
		t := p.snap
		if t == nil {
			continue
		}
		select {
		case <-t.done:
		default:
			continue
		}
		p.snap = nil
		a.m.snapshotSeconds.Observe(t.took.Seconds())
		if t.err != nil {
			a.m.snapshots.WithLabelValues("skipped").Inc()
			a.log.Warn("partition state not snapshotted; the next interval tries again", "partition", id, "err", t.err)
		} else {
			p.snapLen = len(t.data)
		}
		a.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{a.cfg.Topic: {id: {Epoch: -1, Offset: p.next}}})
		a.cl.ResumeFetchPartitions(map[string][]int32{a.cfg.Topic: {id}})
	}
}

// settle waits until p's state is no longer being encoded, for the rare
// changes that cannot wait for the thaw (a policy reload, an operator
// override). The caller holds mu; the encoding does not take it.
func (p *partition) settle() {
	if p.snap != nil {
		<-p.snap.done
	}
}

// dropFrozen un-pauses the partitions of parts that were frozen for a
// snapshot, as they leave this instance, so that a later assignment
// fetches them. The caller holds mu.
func (a *aggregator) dropFrozen(parts []int32) {
	for _, id := range parts {
		if p := a.parts[id]; p != nil && p.snap != nil {
			p.snap = nil
			a.cl.ResumeFetchPartitions(map[string][]int32{a.cfg.Topic: {id}})
		}
	}
}

// finalSnapshots snapshots, at a graceful stop, every partition whose
// state moved since its last snapshot and whose offset is committed, at
// that offset. The next owner then loads it and replays nothing; without
// it a rolling restart replays up to snapshot_interval of events per
// partition (a minute of a busy partition is millions of events and tens
// of seconds). The caller holds mu, has stopped the poll loop and waited
// for the writers, so the states stand still; the encodings run at most
// one per core.
//
// It returns when every snapshot is stored, or when ctx (what is left of
// shutdown_timeout) ends: the stop does not overrun its grace. A snapshot
// cut short is harmless: a restart loads only complete snapshots, and the
// older ones are dropped only after a newer one is stored. A partition
// whose encoding is abandoned stays frozen (p.snap), so that nothing else
// touches its state while the encoding still reads it.
func (a *aggregator) finalSnapshots(ctx context.Context) {
	if a.cfg.SnapshotInterval <= 0 {
		return
	}
	pol := a.watcher.Current()
	ids := make([]int32, 0, len(a.parts))
	for id, p := range a.parts {
		if off, ok := p.w.committed(); ok && off == p.next && a.snapshotWanted(p) && p.state.Policy() == pol {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for _, id := range ids {
		p := a.parts[id]
		task := &snapTask{done: make(chan struct{}), fp: pol.Fingerprint()}
		p.snap = task
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(task.done)
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
				a.storeFinalSnapshot(ctx, p, task.fp)
			case <-ctx.Done():
			}
		}()
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-ctx.Done():
		a.log.Warn("shutdown_timeout ran out before every partition's snapshot was stored at the stop; the next owners of the others replay since their last snapshots", "partitions", ids)
	}
}

// storeFinalSnapshot encodes p's state under the policy fingerprint fp,
// stores it at p.next and drops the snapshots it supersedes (p.next is
// committed).
func (a *aggregator) storeFinalSnapshot(ctx context.Context, p *partition, fp string) {
	begin := time.Now()
	data, err := p.state.Snapshot(make([]byte, 0, p.snapLen+p.snapLen/8), fp)
	a.m.snapshotSeconds.Observe(time.Since(begin).Seconds())
	if err == nil {
		err = a.store.WriteSnapshot(ctx, p.id, p.next, tally.SnapshotVersion, fp, data)
	}
	if err != nil {
		a.m.snapshots.WithLabelValues("failed").Inc()
		a.log.Warn("no snapshot of the partition at the stop; the next owner replays since the last one", "partition", p.id, "offset", p.next, "err", err)
		return
	}
	a.m.snapshots.WithLabelValues("stored").Inc()
	a.log.Info("partition snapshot stored at the stop", "partition", p.id, "offset", p.next, "bytes", len(data), "took", time.Since(begin).Round(time.Millisecond))
	if n, err := a.store.DropSnapshotsBefore(ctx, p.id, p.next); err != nil {
		a.log.Warn("superseded partition snapshots not dropped; the next owner's first commit after a snapshot drops them", "partition", p.id, "offset", p.next, "err", err)
	} else if n > 0 {
		a.m.snapshotsDropped.Add(float64(n))
	}
}

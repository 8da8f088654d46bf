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
// (snapshot). A goroutine of its own copies what the snapshot holds
// (tally.Partition.SnapshotCopy: a memory copy of the counters, about
// 2.8 KB per tenant × model key with its quotas, into the previous copy)
// while the partition is frozen — not fetched, its state left alone by
// the poll loop (process, drain, evictIdle skip it; a policy reload or an
// override waits for the copy to end) — and thawed by the first poll
// after the copy (thawSnapshots). It then encodes the copy (about 5.5 s
// per 1,000,000 keys), which the partition no longer waits for: it goes
// on being fetched, aggregated and signalled from. The instance's other
// partitions never wait. The copy is exactly the state at the drained
// offset j.next, and the snapshot is stored at that offset. The copy is
// kept for the next snapshot to reuse: allocating it afresh every
// interval cost more than copying (zeroed memory, page faults and the
// garbage collector's assists), at the price of holding it between
// snapshots.
//
// The partition's writer stores it (writer.go, takeSnapshot and
// storePending) once it is encoded and the batches it covers are stored —
// they are, since it rides on the job of that drain — before or after
// their offset is committed, whichever comes first: storage and commits
// of the later batches do not wait for the encoding. Once an offset at or
// past a stored snapshot's is committed, the older snapshots of the
// partition are dropped (a restart at the committed offset no longer
// needs them; until then a restart loads the newest snapshot at or below
// its committed offset, so a snapshot stored above it is never loaded
// early). One snapshot at a time is in flight per partition (inflight);
// once it is stored or given up (reapSnapshots), the next may be taken.
// A snapshot that is not stored — the copy or the encoding failed,
// ClickHouse refused it, the writer stopped first — advances nothing: no
// older snapshot is dropped, and the partition's snapNext goes back, so
// that the next interval, or the stop, takes another even if no event
// arrives.
//
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

// snapTask is a snapshot in flight: a copy of a partition's state, taken
// while the partition is frozen, encoded, then stored by its writer.
type snapTask struct {
	fp         string // the policy fingerprint it is taken under
	next, prev int64  // the offset it covers, and the partition's snapNext before it

	copied chan struct{}    // closed when copy is taken (or err set): the partition may thaw
	copy   *tally.StateCopy // reused by the next snapshot once the encoding has ended
	done   chan struct{}    // closed when data, size, err and took are set
	data   []byte           // the encoding, until the writer stored it
	size   int
	err    error
	took   time.Duration

	settled chan struct{} // closed by finish, when stored is set
	once    sync.Once
	stored  bool
}

// isClosed reports, without waiting, whether ch is closed: whether the
// stage of a snapTask that closes it (copied, done, settled) is over. The
// poll goroutine and the writers look at a snapshot in passing and must
// never block on it.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func newSnapTask(fp string, next, prev int64) *snapTask {
	return &snapTask{fp: fp, next: next, prev: prev, copied: make(chan struct{}), done: make(chan struct{}), settled: make(chan struct{})}
}

// finish records whether the snapshot was stored and lets the poll loop
// reap it; only the first call counts.
func (t *snapTask) finish(stored bool) {
	t.once.Do(func() {
		t.stored = stored
		close(t.settled)
	})
}

// snapshotDue reports whether p's state should be snapshotted at the next
// flush: the interval has passed, events were read since the last
// snapshot, none is in flight, no tenant is being restored (its events
// are parked, not in the state) and the partition does not wait for a
// hand-over.
func (a *aggregator) snapshotDue(p *partition) bool {
	return a.snapshotWanted(p) && time.Since(p.snapAt) >= a.cfg.SnapshotInterval
}

// snapshotWanted reports whether p's state, as it stands, is worth a
// snapshot and may be taken: snapshots are on, events were read since the
// last one, none is in flight, and every event read is in the state.
func (a *aggregator) snapshotWanted(p *partition) bool {
	return a.cfg.SnapshotInterval > 0 && p.snap == nil && p.inflight == nil && p.next > p.snapNext &&
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
// j.next; it is frozen (p.snap, p's fetching paused) while a goroutine
// copies it, then thawed while the same goroutine encodes the copy, and
// the writer stores it once encoded, after j's rows, so a snapshot never
// covers an event ClickHouse lacks. None is taken while tenants are being
// restored (their events are parked, not in the state) or while the
// policy in force is not yet the state's.
func (a *aggregator) snapshot(p *partition, j *job) {
	if !a.snapshotDue(p) || j.next != p.next {
		return
	}
	pol := a.watcher.Current()
	if p.state.Policy() != pol {
		return
	}
	start := time.Now()
	task := newSnapTask(pol.Fingerprint(), j.next, p.snapNext)
	p.snapAt, p.snapNext = start, j.next
	a.cl.PauseFetchPartitions(map[string][]int32{a.topics.Usage: {p.id}})
	p.snap, p.inflight, j.snap = task, task, task
	st, spare, size := p.state, p.snapCopy, p.snapLen+p.snapLen/8
	p.snapCopy = nil // the copy's memory is in use until the encoding ends
	go func() {
		begin := time.Now()
		task.copy, task.err = st.SnapshotCopy(spare)
		a.m.snapshotCopy.Observe(time.Since(begin).Seconds())
		close(task.copied)
		a.kickPoll() // thaw the partition without waiting out the poll
		if task.err == nil {
			begin = time.Now()
			task.data, task.err = task.copy.Snapshot(make([]byte, 0, size), task.fp)
			task.size, task.took = len(task.data), time.Since(begin)
			a.m.snapshotSeconds.Observe(task.took.Seconds())
		}
		close(task.done)
	}()
	a.m.snapshotPause.Observe(time.Since(start).Seconds())
}

// thawSnapshots resumes fetching every partition whose state's copy is
// taken, from the offset its state reached, then reaps the snapshots
// stored or given up. The caller holds mu and runs on the poll goroutine
// after a poll and before AllowRebalance (SetOffsets wants no revoke
// running).
func (a *aggregator) thawSnapshots() {
	for id, p := range a.parts {
		t := p.snap
		if t == nil || !isClosed(t.copied) {
			continue
		}
		p.snap = nil
		a.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{a.topics.Usage: {id: {Epoch: -1, Offset: p.next}}})
		a.cl.ResumeFetchPartitions(map[string][]int32{a.topics.Usage: {id}})
	}
	a.reapSnapshots()
}

// reapSnapshots ends the snapshots in flight that were stored or given up,
// so that the next may be taken. One not stored gives its offset back:
// snapNext returns to what it was, and the next interval (or the stop)
// snapshots the partition again even if no event arrives. The caller holds
// mu.
func (a *aggregator) reapSnapshots() {
	for id, p := range a.parts {
		t := p.inflight
		if t == nil || p.snap == t || !isClosed(t.settled) {
			continue // none, still frozen for its copy, or not yet stored or given up
		}
		p.inflight = nil
		// A snapshot given up by a stopped writer while still encoding may
		// still read its copy; only one whose encoding ended gives it back.
		if isClosed(t.done) {
			p.snapCopy = t.copy
		}
		t.copy = nil
		if t.err != nil {
			a.m.snapshots.WithLabelValues("skipped").Inc()
			a.log.Warn("partition state not snapshotted; the next interval tries again", "partition", id, "err", t.err)
		} else if t.size > 0 {
			p.snapLen = t.size
		}
		if !t.stored && p.snapNext == t.next {
			p.snapNext = t.prev
		}
	}
}

// settle waits until p's state is no longer being copied, for the rare
// changes that cannot wait for the thaw (a policy reload, an operator
// override). The caller holds mu; the copy does not take it.
func (p *partition) settle() {
	if p.snap != nil {
		<-p.snap.copied
	}
}

// dropFrozen un-pauses the partitions of parts that were frozen for a
// snapshot's copy, as they leave this instance, so that a later assignment
// fetches them, and forgets their snapshots in flight (their writers,
// stopped, store nothing more). The caller holds mu.
func (a *aggregator) dropFrozen(parts []int32) {
	for _, id := range parts {
		if p := a.parts[id]; p != nil {
			if p.snap != nil {
				p.snap = nil
				a.cl.ResumeFetchPartitions(map[string][]int32{a.topics.Usage: {id}})
			}
			p.inflight = nil
		}
	}
}

// awaitSnapshots waits, at a graceful stop, until the snapshots in flight
// are stored or given up (their writers still run), or ctx ends, then
// reaps them. The caller holds mu; neither the copies, the encodings nor
// the writers take it.
func (a *aggregator) awaitSnapshots(ctx context.Context) {
	for _, p := range a.parts {
		if t := p.inflight; t != nil {
			select {
			case <-t.settled:
			case <-ctx.Done():
			}
			select {
			case <-t.copied:
				p.snap = nil // no poll thaws it any more; the stop resumes nothing
			default:
			}
		}
	}
	a.reapSnapshots()
}

// finalSnapshots snapshots, at a graceful stop, every partition whose
// state moved since its last snapshot and whose offset is committed, at
// that offset. The next owner then loads it and replays nothing; without
// it a rolling restart replays up to snapshot_interval of events per
// partition (a minute of a busy partition is millions of events and tens
// of seconds). The caller holds mu, has stopped the poll loop and waited
// for the writers' queues, so the states stand still; the snapshots still
// in flight are stored (or given up) first; the encodings run at most one
// per core, from the states themselves (no copy: nothing moves them).
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
	a.awaitSnapshots(ctx)
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
		task := newSnapTask(pol.Fingerprint(), p.next, p.snapNext)
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
	cp, err := p.state.SnapshotCopy(p.snapCopy) // into the last copy's memory, as the interval's snapshots
	var data []byte
	if err == nil {
		data, err = cp.Snapshot(make([]byte, 0, p.snapLen+p.snapLen/8), fp)
	}
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

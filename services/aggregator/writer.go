package aggregator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/faults"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// job is one flushed batch of a partition waiting for ClickHouse: its
// signals are already published; once it is stored, offset next (read at
// leader epoch epoch) is committed.
type job struct {
	b        *chstore.Batch
	reroutes []*kgo.Record
	next     int64
	epoch    int32
	count    int32 // the partition count it was drained under, committed as metadata (handover.go)
	rows     int
	// snap, if set, is the snapshot of the partition's state covering the
	// events below next, encoded from a copy (snapshot.go).
	snap *snapTask
}

// writer stores one partition's flushed batches in ClickHouse, strictly in
// flush order (late-minute repairs read the raw events of earlier batches),
// and commits the offset after them once they are stored. It runs beside
// the poll loop so that a ClickHouse outage delays storage and commits but
// not reading and signalling; the aggregator bounds what may queue up
// (max_unwritten_rows) and stops fetching beyond it.
//
// It writes at most once per store_interval: every batch queued meanwhile
// goes into the same inserts, one per table, and one commit. Flushes are
// frequent because they publish the signals enforcement waits for
// (flush_interval, tens of milliseconds); storing each of them as its own
// set of inserts and commit cost ClickHouse and the broker more CPU than
// every other component of the pipeline together (bench/README.md).
type writer struct {
	part   int32
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{} // capacity 1: a job was queued
	hurry  chan struct{} // capacity 1: someone waits for the queue; skip the rest of store_interval

	mu    sync.Mutex
	queue []*job
	// drained is closed whenever the queue is empty and nothing is being
	// written; replaced by an open channel when a job is queued.
	drained chan struct{}
	// written is the offset after the last batch stored (and, unless
	// commitFailed, committed).
	written      int64
	commitFailed bool
	// stale is the offset of the newest snapshot stored whose older
	// snapshots are not dropped yet: they go once an offset at or past
	// it is committed. pending is a snapshot whose batches are stored and
	// whose encoding had not ended when they were: it is stored as soon as
	// it is encoded. Only the writer's goroutine uses them.
	stale   int64
	pending *snapTask
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// startWriter starts the writer of partition part, whose stored and
// committed position is offset.
func (a *aggregator) startWriter(part int32, offset int64) *writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{part: part, ctx: ctx, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1),
		hurry: make(chan struct{}, 1), drained: closedChan(), written: offset}
	go a.runWriter(w)
	return w
}

// enqueue hands j to the writer. The caller has published j's signals.
func (a *aggregator) enqueue(w *writer, j *job) {
	w.mu.Lock()
	if len(w.queue) == 0 {
		w.drained = make(chan struct{})
	}
	w.queue = append(w.queue, j)
	w.mu.Unlock()
	a.unwritten.Add(int64(j.rows))
	a.m.unwritten.Set(float64(a.unwritten.Load()))
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// status reports whether everything handed to w is stored (idle), and
// whether its last commit was refused with nothing queued to commit again
// (recommit: the next flush must queue a job even if empty).
func (w *writer) status() (idle, recommit bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue) == 0, len(w.queue) == 0 && w.commitFailed
}

// committed reports the offset after the last batch stored, and whether
// it is committed: nothing is queued and the last commit succeeded.
func (w *writer) committed() (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written, len(w.queue) == 0 && !w.commitFailed
}

// wait blocks until w's queue is stored, or ctx ends.
func (w *writer) wait(ctx context.Context) error {
	w.mu.Lock()
	d := w.drained
	w.mu.Unlock()
	select {
	case <-d:
		return nil
	default:
	}
	select {
	case w.hurry <- struct{}{}:
	default:
	}
	select {
	case <-d:
		return nil
	case <-w.done:
		return fmt.Errorf("partition %d: writer stopped with batches unwritten", w.part)
	case <-ctx.Done():
		return fmt.Errorf("partition %d: batches still unwritten: %w", w.part, ctx.Err())
	}
}

// stop ends w, abandoning what it has not stored (nothing past it is
// committed, so the next owner reads it again), and waits for it.
func (a *aggregator) stop(w *writer) {
	w.cancel()
	<-w.done
}

func (a *aggregator) runWriter(w *writer) {
	defer func() {
		if w.pending != nil {
			w.pending.finish(false) // a stopped writer stores nothing more
		}
		w.mu.Lock()
		n := 0
		for _, j := range w.queue {
			n += j.rows
			if j.snap != nil {
				j.snap.finish(false) // its rows are not stored: neither is it
			}
		}
		w.queue = nil
		w.mu.Unlock()
		a.release(n)
		close(w.done)
	}()
	var last time.Time // when the last write started
	var jobs []*job
	var batches []*chstore.Batch
	for {
		a.storePending(w)
		w.mu.Lock()
		n := len(w.queue)
		w.mu.Unlock()
		if n == 0 {
			var encoded chan struct{} // nil: none pending, never ready
			if w.pending != nil {
				encoded = w.pending.done
			}
			select {
			case <-w.ctx.Done():
				return
			case <-w.wake:
				continue
			case <-encoded:
				continue
			}
		}
		if wait := a.cfg.StoreInterval - time.Since(last); wait > 0 {
			// Let more flushes queue up and store them together.
			t := time.NewTimer(wait)
			select {
			case <-w.ctx.Done():
				t.Stop()
				return
			case <-w.hurry:
			case <-t.C:
			}
			t.Stop()
		}
		w.mu.Lock()
		jobs = append(jobs[:0], w.queue...)
		w.mu.Unlock()
		batches = batches[:0]
		rows := 0
		for _, j := range jobs {
			batches, rows = append(batches, j.b), rows+j.rows
		}
		end := jobs[len(jobs)-1]
		start := time.Now()
		last = start
		if err := a.retry(w.ctx, "clickhouse write", w.part, func() error {
			ctx, cancel := context.WithTimeout(w.ctx, a.cfg.WriteTimeout)
			defer cancel()
			if err := faults.At(ctx, faults.Write); err != nil {
				return err
			}
			return a.store.Write(ctx, batches...)
		}); err != nil {
			return
		}
		a.m.writeRows.Observe(float64(rows))
		a.m.writeSeconds.Observe(time.Since(start).Seconds())
		a.takeSnapshot(w, jobs)
		a.storePending(w) // before the commit, if it is encoded already
		cerr := a.commit(w.ctx, w.part, end)
		if cerr == nil && w.stale > 0 && end.next >= w.stale {
			a.dropStaleSnapshots(w)
		}
		w.mu.Lock()
		w.queue = w.queue[len(jobs):]
		w.written, w.commitFailed = end.next, cerr != nil
		if len(w.queue) == 0 {
			close(w.drained)
		}
		w.mu.Unlock()
		a.release(rows)
		for i, j := range jobs {
			j.snap = nil
			j.b.Reset()
			batchPool.Put(j.b)
			jobs[i], batches[i] = nil, nil
		}
	}
}

// takeSnapshot makes the newest snapshot among jobs, whose rows are
// stored, the writer's pending one. One snapshot is in flight per
// partition at a time, so there is no other; one left over would be given
// up.
func (a *aggregator) takeSnapshot(w *writer, jobs []*job) {
	for i := len(jobs) - 1; i >= 0; i-- {
		if t := jobs[i].snap; t != nil {
			if w.pending != nil && w.pending != t {
				w.pending.finish(false)
			}
			w.pending = t
			return
		}
	}
}

// storePending stores the pending snapshot if it is encoded, and drops
// the snapshots it supersedes if its offset is committed already (the
// commit after the next batch drops them otherwise). Its rows are stored.
// A failure is not retried: the snapshot is given up (reapSnapshots), the
// next interval takes another, and a restart meanwhile uses an older one
// or rebuilds in full.
func (a *aggregator) storePending(w *writer) {
	t := w.pending
	if t == nil || !isClosed(t.done) {
		return // none, or still encoding
	}
	w.pending = nil
	if t.err != nil {
		t.finish(false) // counted and logged by reapSnapshots
		return
	}
	ctx, cancel := context.WithTimeout(w.ctx, max(a.cfg.WriteTimeout, time.Minute))
	err := a.store.WriteSnapshot(ctx, w.part, t.next, tally.SnapshotVersion, t.fp, t.data)
	cancel()
	t.data = nil
	if err != nil {
		a.m.snapshots.WithLabelValues("failed").Inc()
		a.log.Warn("partition snapshot not stored; the next interval takes another", "partition", w.part, "offset", t.next, "err", err)
		t.finish(false)
		return
	}
	a.m.snapshots.WithLabelValues("stored").Inc()
	a.log.Debug("partition snapshot stored", "partition", w.part, "offset", t.next, "bytes", t.size)
	w.stale = t.next
	t.finish(true)
	if off, ok := w.committed(); ok && off >= t.next {
		a.dropStaleSnapshots(w)
	}
}

// dropStaleSnapshots drops the partition's snapshots older than the
// newest stored, once an offset at or past it is committed: a restart
// resumes at or past it and loads it (or a newer one). A failure is
// logged and tried again after the next commit.
func (a *aggregator) dropStaleSnapshots(w *writer) {
	ctx, cancel := context.WithTimeout(w.ctx, max(a.cfg.WriteTimeout, time.Minute))
	defer cancel()
	n, err := a.store.DropSnapshotsBefore(ctx, w.part, w.stale)
	if n > 0 {
		a.m.snapshotsDropped.Add(float64(n))
	}
	if err != nil {
		a.log.Warn("superseded partition snapshots not dropped; retrying after the next commit", "partition", w.part, "offset", w.stale, "err", err)
		return
	}
	w.stale = 0
}

// release takes n rows off the unwritten count and wakes a poll loop
// waiting for room.
func (a *aggregator) release(n int) {
	if n == 0 {
		return
	}
	a.unwritten.Add(-int64(n))
	a.m.unwritten.Set(float64(a.unwritten.Load()))
	select {
	case a.room <- struct{}{}:
	default:
	}
}

// commit commits j's offset. A refusal is not retried: ClickHouse holds
// the rows, so at worst the next owner re-reads (and re-signals, same ids)
// the events; the next flush of this partition commits again.
func (a *aggregator) commit(ctx context.Context, part int32, j *job) error {
	commit := map[string]map[int32]kgo.EpochOffset{a.topics.Usage: {part: {Epoch: j.epoch, Offset: j.next}}}
	cerr := faults.At(ctx, faults.Commit)
	if cerr == nil {
		cerr = kafkaconn.CommitSync(a.withCommitMetadata(ctx, part, j.count), a.cl, commit)
	}
	if cerr != nil {
		a.m.commitErrors.Inc()
		a.log.Warn("offset commit refused; the next flush commits again", "partition", part, "offset", j.next, "err", cerr)
	}
	return cerr
}

// batchPool recycles flushed batches and their buffers.
var batchPool = sync.Pool{New: func() any { return new(chstore.Batch) }}

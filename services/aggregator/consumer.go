package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/faults"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

type aggregator struct {
	cfg     Config
	topics  platform.Topics
	log     *slog.Logger
	m       *metrics
	watcher *policy.Watcher
	store   *chstore.Store
	cl      *kgo.Client
	admin   *adminFollower
	auth    *signalauth.Auth // signs every signal record
	// tracer is nil when tracing is off (tracing.go).
	tracer trace.Tracer

	// mu guards parts. The poll loop holds it while processing a poll; the
	// rebalance callbacks (which franz-go runs only between polls, given
	// BlockRebalanceOnPoll) hold it while they flush or rebuild.
	mu    sync.Mutex
	parts map[int32]*partition
	since time.Time // when the oldest unflushed event was read; zero: none
	// sizedAt is when flushAll last counted the state's size for the
	// state gauges (stateSizeEvery).
	sizedAt time.Time
	ev      schemas.UsageEvent

	// unwritten counts the rows flushed (signals published) but not yet
	// stored in ClickHouse, across partitions; room is signalled when it
	// drops. Beyond MaxUnwrittenRows the poll loop stops fetching.
	unwritten atomic.Int64
	room      chan struct{}

	// nparts is the usage topic's partition count, which decides every
	// tenant's home partition (route.go); lastMeta is when the poll loop
	// last read it.
	nparts         atomic.Int32
	lastMeta       time.Time
	lastSchemaWarn time.Time // guarded by mu
	// pastCounts holds the partition counts the topic had before (from
	// quota_state versions at assignment, and changes seen since); guarded
	// by mu.
	pastCounts map[int]bool
	// The hand-over of moved tenants (handover.go), guarded by mu:
	// waiting holds the partitions stopped at a moved tenant's first
	// event, commitCounts the partition count of each usage partition's
	// last commit as last read. lastHandoverRead is the poll loop's own.
	waiting          map[int32]*handoverWait
	commitCounts     map[int32]int32
	lastHandoverRead time.Time

	// restoring counts the assigned partitions whose state is being
	// restored (onAssigned); the instance is not ready meanwhile.
	restoring atomic.Int32

	// kick cuts the poll loop's current wait short (a restore ended);
	// restored holds a token for a restore that ended between two polls.
	kickMu   sync.Mutex
	kick     context.CancelFunc
	restored chan struct{}
}

// partition is one assigned partition: its state and what is not flushed.
type partition struct {
	id       int32
	state    *tally.Partition
	batch    *chstore.Batch // events read since the last flush
	next     int64          // offset after the last event processed
	enqueued int64          // offset after the last event flushed to the writer
	epoch    int32
	pending  int // events processed since the last flush, counted or not
	w        *writer
	reroutes []*kgo.Record // records to produce to their tenant's home partition before the next commit
	// traces holds, for each signal raised and not drained yet, the span
	// context of the event that raised it (tracing.go); nil when none.
	traces map[string]trace.SpanContext
	// unsent holds the jobs drained by flushes cut short before their
	// records were published, oldest first: the next flush publishes them
	// again and hands them to the writer before anything newer (flushAll).
	unsent []*job
	// count is the partition count the last batch was drained under; 0
	// before the first. A batch under the current count is queued even
	// with nothing new, so that the partition hands over (handover.go).
	count int32
	// restoring holds the evicted tenants being rebuilt from ClickHouse
	// (restore.go) and the events waiting for them, parked in all.
	restoring map[string]*pendingRestore
	parked    int
	rctx      context.Context // cancelled when the partition goes
	rcancel   context.CancelFunc
	// snapAt is when the partition's state was last snapshotted (or
	// rebuilt): the next snapshot is due SnapshotInterval after it, if
	// events were read since snapNext, the offset the last one covers
	// (snappedAt).
	snapAt   time.Time
	snapNext int64
	// snap is the snapshot whose copy of the state is being taken, off
	// the poll loop (snapshot.go): until the copy is taken the state is
	// frozen — its partition is not fetched and the poll loop leaves the
	// state alone. inflight is the snapshot being encoded from its copy
	// and stored, while the partition flows; snapCopy the last copy, whose
	// memory the next one reuses; snapLen the last snapshot's size, to
	// size the next one's buffer.
	snap     *snapTask
	inflight *snapTask
	snapCopy *tally.StateCopy
	snapLen  int
}

func newAggregator(cfg Config, env platform.Env, w *policy.Watcher) *aggregator {
	a := &aggregator{cfg: cfg, topics: env.Topics, log: env.Logger, m: newMetrics(env.Metrics, w), watcher: w, parts: map[int32]*partition{},
		room: make(chan struct{}, 1), pastCounts: map[int]bool{}, waiting: map[int32]*handoverWait{}, commitCounts: map[int32]int32{}, restored: make(chan struct{}, 1)}
	if traceprop.On(env.Tracing) {
		a.tracer = traceprop.Tracer(env.Tracing, "aggregator")
	}
	return a
}

func (a *aggregator) kafkaOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(a.cfg.Group),
		kgo.ConsumeTopics(a.topics.Usage),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(a.cfg.SessionTimeout),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(a.onAssigned),
		kgo.OnPartitionsRevoked(a.onRevoked),
		kgo.OnPartitionsLost(a.onLost),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(a.partitioner()),
	}
}

// costFunc prices events with the policy in force, for minute repairs,
// as the tally does: an unpriced model at the unpriced_price.
func (a *aggregator) costFunc() chstore.CostFunc {
	pol := a.watcher.Current()
	return func(model string, at time.Time, tok policy.Tokens) (cost, billed float64) {
		pr, _, _, _ := pol.CostSpan(model, at.Unix())
		return pr.Cost(tok), pr.BilledTokens(tok)
	}
}

func (a *aggregator) loop(ctx context.Context) {
	for ctx.Err() == nil {
		if !a.waitForRoom(ctx) {
			return
		}
		if time.Since(a.lastMeta) > partitionsRefresh {
			// Partitions added to the topic move tenants' homes; pick the
			// new count up (a failure keeps the old one until the next try).
			a.mu.Lock()
			if err := a.refreshPartitions(ctx, kadm.NewClient(a.cl)); err != nil && ctx.Err() == nil {
				a.log.Warn("reading the usage topic's partition count failed", "err", err)
			}
			a.mu.Unlock()
			a.lastMeta = time.Now()
		}
		counts := a.readCommitCounts(ctx)
		wait := a.cfg.FlushInterval
		a.mu.Lock()
		if !a.since.IsZero() {
			wait = max(time.Until(a.since.Add(a.cfg.FlushInterval)), time.Millisecond)
		}
		a.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, wait)
		a.setKick(cancel) // a restore that ends cuts the wait short
		fetches := a.cl.PollRecords(pctx, a.cfg.BatchEvents)
		a.setKick(nil)
		cancel()
		if fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				a.log.Warn("fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		a.mu.Lock()
		a.resumeHandovers(counts)
		a.thawSnapshots()
		a.finishRestores() // before the fetch: a tenant's waiting events precede its new ones
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) { a.process(ctx, ftp) })
		if (!a.since.IsZero() && (a.pendingMax() >= a.cfg.BatchEvents || time.Since(a.since) >= a.cfg.FlushInterval)) || a.snapshotsDue() {
			if err := a.flushAll(ctx); err != nil && ctx.Err() == nil {
				a.log.Error("flush failed", "err", err)
			}
		}
		a.evictIdle()
		a.mu.Unlock()
		a.cl.AllowRebalance()
	}
}

// evictIdle drops idle tenants from the partitions whose writer has stored
// everything drained so far (a tenant is only forgotten once ClickHouse
// holds all of it; tenants with undrained changes are kept). It runs every
// poll, flush or not, so the last batch before a quiet spell is followed
// by a scan once it is stored; EvictIdle itself scans at most once per
// minute of event time.
func (a *aggregator) evictIdle() {
	for _, p := range a.parts {
		// Only a partition with nothing processed-but-unstored may evict:
		// an evicted tenant is later rebuilt from ClickHouse, and events
		// still in the batch or the writer's queue (a late event for a
		// closed hour, say) would be missing from that rebuild.
		if idle, _ := p.w.status(); idle && p.snap == nil && len(p.unsent) == 0 && p.next == p.enqueued && (p.batch == nil || len(p.batch.Events) == 0) && !p.state.Pending() {
			if n := p.state.EvictIdle(); n > 0 {
				a.m.evictions.Add(float64(n))
			}
		}
	}
}

// waitForRoom holds the poll loop while more than MaxUnwrittenRows rows
// wait for ClickHouse, so an outage cannot grow memory without bound: the
// events not fetched meanwhile stay in Kafka. It reports false when ctx
// ended.
func (a *aggregator) waitForRoom(ctx context.Context) bool {
	if a.unwritten.Load() < int64(a.cfg.MaxUnwrittenRows) {
		return true
	}
	a.log.Warn("fetching paused: too many rows wait for ClickHouse", "unwritten_rows", a.unwritten.Load(), "max_unwritten_rows", a.cfg.MaxUnwrittenRows)
	a.m.fetchPauses.Inc()
	for a.unwritten.Load() >= int64(a.cfg.MaxUnwrittenRows) {
		select {
		case <-ctx.Done():
			return false
		case <-a.room:
		case <-time.After(time.Second):
		}
	}
	a.log.Info("fetching resumed", "unwritten_rows", a.unwritten.Load())
	return true
}

func (a *aggregator) pendingMax() int {
	n := 0
	for _, p := range a.parts {
		n = max(n, p.pending)
	}
	return n
}

func (a *aggregator) process(ctx context.Context, ftp kgo.FetchTopicPartition) {
	if len(ftp.Records) == 0 {
		return
	}
	p := a.parts[ftp.Partition]
	if p == nil {
		// Cannot happen with BlockRebalanceOnPoll; refuse rather than count
		// events whose state was not rebuilt.
		a.log.Error("records for a partition without state; skipped, will be re-read", "partition", ftp.Partition)
		return
	}
	if a.waiting[p.id] != nil || p.snap != nil {
		// Fetched before the pause took effect; read again on resume.
		return
	}
	pol := a.watcher.Current()
	p.state.SetPolicy(pol)
	before := p.state.Stats
	now := time.Now()
	for _, rec := range ftp.Records {
		if rec.Offset < p.next {
			continue // re-delivered after a retry inside the client
		}
		if p.parked >= maxParkedEvents && !a.awaitRestores(ctx, p) {
			break // only a cancelled ctx gets here: the rest is read again
		}
		ev := &a.ev
		if !schemaOK(rec) {
			a.m.wrongSchema.Inc()
			if time.Since(a.lastSchemaWarn) > 10*time.Second {
				a.lastSchemaWarn = time.Now()
				a.log.Warn("skipping usage records without header schema="+schemas.SchemaUsageV1+" (see docs/producers.md); counted in sluice_aggregator_events_total{result=\"wrong_schema\"}",
					"partition", rec.Partition, "offset", rec.Offset)
			}
		} else if err := eventjson.DecodeUsageEvent(rec.Value, ev); err != nil {
			a.m.invalid.Inc()
			a.log.Warn("skipping an undecodable usage event", "partition", rec.Partition, "offset", rec.Offset, "err", err)
		} else if home, ok := a.home(ev.Tenant); ok && home != rec.Partition {
			a.reroute(p, rec, ev.Tenant, home)
		} else {
			// The future bound is measured from the record's time, capped
			// by this host's clock (a producer's clock may be wrong too).
			ref := now
			if rec.Timestamp.After(time.Unix(0, 0)) && rec.Timestamp.Before(now) {
				ref = rec.Timestamp
			}
			p.state.SetClock(ref)
			moved := false
			if p.restoring[ev.Tenant] == nil && !p.state.Known(ev.Tenant) {
				if from := a.oldHomes(ev.Tenant, p.id); len(from) > 0 {
					// The topic gained partitions and this tenant's home may
					// have moved here: its month so far is what its old
					// homes stored, once they stored all of it (handover.go).
					if !a.mayRestoreMoved(p, ev.Tenant, from, rec.Offset) {
						break // p is paused at rec, which is read again
					}
					// Handed over: rebuilt off the poll loop like an evicted
					// tenant (restore.go); rec waits with its later events.
					a.startRestore(p, ev, rec.Partition, rec.Offset, ref)
					moved = true
				}
			}
			switch pr := p.restoring[ev.Tenant]; {
			case moved:
				// Parked by startRestore.
			case pr != nil:
				// Its restore is still running: the event waits with it.
				pr.park(p, ev, rec.Partition, rec.Offset, ref)
			default:
				var r tally.Result
				if a.tracer != nil {
					r = a.countTraced(p, rec, ev, ref)
				} else {
					r = a.count(p, ev, rec.Partition, rec.Offset, ref)
				}
				if r == tally.Evicted {
					// Rebuilt off the poll loop (restore.go); the tenant's
					// events wait, every other tenant's keep flowing.
					a.startRestore(p, ev, rec.Partition, rec.Offset, ref)
				}
			}
		}
		p.next, p.epoch = rec.Offset+1, rec.LeaderEpoch
		p.pending++
	}
	a.countStats(before, p.state.Stats)
	a.m.lag.WithLabelValues(fmt.Sprint(ftp.Partition)).Set(float64(max(ftp.HighWatermark-p.next, 0)))
	if a.since.IsZero() {
		a.since = time.Now()
	}
}

// count applies one decoded event to p's state and adds it to the batch
// ClickHouse stores when it was counted or held. It returns Evicted, and
// does nothing else, for a tenant evicted as idle.
func (a *aggregator) count(p *partition, ev *schemas.UsageEvent, part int32, offset int64, ref time.Time) tally.Result {
	r := p.state.Apply(ev, offset)
	if r == tally.TooFarAhead {
		a.log.Warn("refusing a usage event stamped too far ahead: the hold of future events is full (aggregator.future_hold_capacity); fix the producer's clock",
			"partition", part, "offset", offset, "tenant", ev.Tenant, "id", ev.ID, "time", ev.Time, "reference", ref)
	}
	if r == tally.Accepted || r == tally.Held {
		if p.batch == nil {
			p.batch = batchPool.Get().(*chstore.Batch)
		}
		p.batch.Events = append(p.batch.Events, chstore.Event{UsageEvent: *ev, Partition: part, Offset: offset})
	}
	return r
}

// countStats adds what p's state counted between two readings of its
// Stats to the metrics.
func (a *aggregator) countStats(before, after tally.Stats) {
	a.m.restores.Add(float64(after.RestoredTenants - before.RestoredTenants))
	a.m.accepted.Add(float64(after.Accepted - before.Accepted))
	a.m.duplicates.Add(float64(after.Duplicates - before.Duplicates))
	a.m.rejected.Add(float64(after.Rejected - before.Rejected))
	a.m.late.Add(float64(after.Late - before.Late))
	a.m.held.Add(float64(after.Held - before.Held))
	a.m.released.Add(float64(after.Released - before.Released))
	a.m.tooFarAhead.Add(float64(after.Refused - before.Refused))
}

// policyChanged re-evaluates every tenant in memory under a reloaded
// policy at once (see tally.Partition.Reevaluate) and has the next flush
// write and publish what changed, even with no new event: a blocked tenant
// whose limit was raised sends none.
func (a *aggregator) policyChanged(pol *policy.Policy) {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := time.Now()
	signals := 0
	for _, p := range a.parts {
		p.settle()
		before := len(p.state.PendingSignals())
		p.state.Reevaluate(pol)
		signals += len(p.state.PendingSignals()) - before
	}
	a.markPending()
	a.m.reevaluations.Inc()
	a.log.Info("policy applied to every tenant in memory", "file", pol.Source(), "partitions", len(a.parts), "signals", signals, "took", time.Since(start).Round(time.Microsecond))
}

// flushAll flushes every partition with something pending: it publishes
// the signals of all of them, then hands each partition's rows to its
// writer, which stores them in ClickHouse and then commits.
//
// A flush cut short (ctx ended while publishing: a stop, a revoke past
// shutdown_timeout, a partition-count refresh's timeout) keeps what it
// drained in each partition's unsent jobs, and the next flush publishes
// them again before anything newer and hands them over in order. The
// writer commits only the offsets of jobs it was handed, so no commit
// passes an event whose rows and signals were not handed to it; if no
// later flush succeeds (the stop's own runs out of grace too), nothing
// past the last stored batch is committed and the next owner re-reads it.
func (a *aggregator) flushAll(ctx context.Context) error {
	parts, recs := a.drainAll()
	if len(recs) > 0 {
		// Records found off their tenant's home partition go there before
		// the offset past them is committed (route.go).
		// Signals go out before ClickHouse is written: enforcement must not
		// wait for the store (an outage there would switch it off), and
		// their ids are deterministic, so the re-publication that follows
		// a crash before the write, or a flush cut short, is folded by
		// every consumer.
		if err := a.retry(ctx, "produce signals", -1, func() error {
			if err := faults.At(ctx, faults.Produce); err != nil {
				return err
			}
			return a.cl.ProduceSync(ctx, recs...).FirstErr()
		}); err != nil {
			// Only an ended ctx gets here. The batches stay unsent, so
			// nothing of them or after them is committed, and the poll
			// loop's next flush is due at once.
			a.m.flushesCut.Inc()
			if a.since.IsZero() {
				a.since = time.Now()
			}
			return err
		}
	}
	for _, p := range parts {
		a.handOver(p)
	}
	a.since = time.Time{}
	if now := time.Now(); now.Sub(a.sizedAt) >= stateSizeEvery {
		a.sizedAt = now
		a.countState()
	}
	return nil
}

// drainAll drains every partition into its unsent jobs. It returns the
// partitions with unsent jobs, in partition order, and the records those
// jobs publish: signals and re-routed records, oldest job first.
func (a *aggregator) drainAll() ([]*partition, []*kgo.Record) {
	ids := make([]int32, 0, len(a.parts))
	for id := range a.parts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var parts []*partition
	var recs []*kgo.Record
	for _, id := range ids {
		p := a.parts[id]
		if j := a.drain(p); j != nil {
			p.unsent = append(p.unsent, j)
		}
		if len(p.unsent) == 0 {
			continue
		}
		parts = append(parts, p)
		for _, j := range p.unsent {
			recs = append(a.signalRecords(recs, j.b), j.reroutes...)
		}
	}
	return parts, recs
}

// handOver gives p's unsent jobs, whose records are published, to its
// writer in the order they were drained.
func (a *aggregator) handOver(p *partition) {
	for i, j := range p.unsent {
		for k := range j.b.Signals {
			a.m.signals.WithLabelValues(string(j.b.Signals[k].Kind)).Inc()
		}
		p.enqueued = j.next
		a.enqueue(p.w, j)
		p.unsent[i] = nil
	}
	p.unsent = p.unsent[:0]
	p.pending = 0
}

// stateSizeEvery is how often flushAll refreshes the state-size gauges.
// Counting walks every tenant of every partition: 0.9 ms at 100,000
// keys and 23.5 ms at 1,000,000 (2-core Xeon), which at every flush cost
// the poll loop 2% of a core at the default flush_interval of 1 s and
// more than it had at 20 ms; gauges scraped every 15 s or so need no
// fresher count.
const stateSizeEvery = 5 * time.Second

// countState sets the state-size gauges: series, remembered ids and held
// events over every partition.
func (a *aggregator) countState() {
	series, idsHeld := 0, 0
	for _, p := range a.parts {
		s, i := p.state.Entries()
		series, idsHeld = series+s, idsHeld+i
	}
	held := 0
	for _, p := range a.parts {
		held += p.state.Held()
	}
	a.m.series.Set(float64(series))
	a.m.ids.Set(float64(idsHeld))
	a.m.heldNow.Set(float64(held))
}

// drain turns what p processed since its last flush into a job: events,
// changed rows and new signals, versioned by the offset it reaches. It
// returns nil when there is nothing to flush: no new offset, no commit to
// repeat, and no signal or row a re-evaluation (a policy change, an
// override) left pending without a new event.
func (a *aggregator) drain(p *partition) *job {
	if p.snap != nil {
		// Frozen for its snapshot: nothing was read since; whatever else
		// is due waits for the next flush after the thaw.
		return nil
	}
	_, recommit := p.w.status()
	n := a.nparts.Load()
	if p.next == p.drainedTo() && !recommit && !p.state.Pending() && p.count == n && !a.snapshotDue(p) {
		return nil
	}
	p.count = n
	reroutes := p.reroutes
	p.reroutes = nil
	b := p.batch
	if b == nil {
		b = batchPool.Get().(*chstore.Batch)
	}
	p.batch = nil
	p.state.Drain(&b.Rows)
	// Encode the new signals once, for signals_log and for Kafka. An
	// invalid one is a bug, not an outage: log it loudly and keep the rest
	// rather than stall the partition on it.
	for _, sg := range p.state.TakeSignals() {
		v, err := schemas.EncodeSignal(&sg)
		if err != nil {
			a.log.Error("dropping an invalid signal", "id", sg.ID, "kind", sg.Kind, "err", err)
			continue
		}
		b.Signals = append(b.Signals, sg)
		b.Payloads = append(b.Payloads, v)
		a.traceSignal(p, b, &sg)
	}
	// Versions grow per tenant across partitions: see chstore.VersionShift.
	b.Version = uint64(n)<<chstore.VersionShift | uint64(p.next)
	j := &job{b: b, reroutes: reroutes, next: p.committable(), epoch: p.epoch, count: n, rows: len(b.Events) + len(b.Minutes) + len(b.Quotas) + len(b.Signals)}
	a.snapshot(p, j)
	return j
}

// drainedTo is the offset after the last event p drained: that of its
// newest unsent job, or else of what its writer was handed.
func (p *partition) drainedTo() int64 {
	if n := len(p.unsent); n > 0 {
		return p.unsent[n-1].next
	}
	return p.enqueued
}

// signalRecords appends b's signals as records for the signals topic.
func (a *aggregator) signalRecords(recs []*kgo.Record, b *chstore.Batch) []*kgo.Record {
	for i := range b.Signals {
		s := &b.Signals[i]
		rec := a.auth.Record(a.topics.Signals, []byte(s.Tenant), b.Payloads[i])
		injectSignal(rec, b, i)
		recs = append(recs, rec)
	}
	return recs
}

func (a *aggregator) retry(ctx context.Context, what string, part int32, fn func() error) error {
	wait := a.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		a.m.writeErrors.WithLabelValues(what).Inc()
		a.log.Warn(what+" failed; retrying", "partition", part, "attempt", attempt, "retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("partition %d: %s: %w (gave up: %v)", part, what, err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, a.cfg.RetryMax)
	}
}

// onAssigned rebuilds each new partition's state from ClickHouse before
// franz-go starts fetching it: the distinct events stored below the offset
// consumption resumes from.
func (a *aggregator) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	parts := assigned[a.topics.Usage]
	if len(parts) == 0 {
		return
	}
	// Not ready (readiness) until every new partition is restored: a
	// rolling restart waits for this instance to hold its share.
	a.restoring.Add(int32(len(parts)))
	a.mu.Lock()
	defer a.mu.Unlock()
	adm := kadm.NewClient(cl)
	_ = a.retry(ctx, "read the usage topic's partition count", -1, func() error { return a.refreshPartitions(ctx, adm) })
	_ = a.retry(ctx, "read past partition counts from clickhouse", -1, func() error {
		counts, err := a.store.PartitionCounts(ctx)
		for _, c := range counts {
			a.pastCounts[c] = true
		}
		return err
	})
	var resume map[int32]int64
	_ = a.retry(ctx, "fetch committed offsets", -1, func() error {
		var err error
		resume, err = resumeOffsets(ctx, adm, a.cfg.Group, a.topics.Usage, parts)
		return err
	})
	// The partitions are restored concurrently, at most one per core: a
	// restore is reading a snapshot, decoding it and replaying events,
	// and an instance given several partitions at once (its start, a
	// peer's crash) would otherwise restore them one after the other.
	// Each restore touches only its own state; they are added to parts
	// together, under mu.
	restored := make([]*partition, len(parts))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, id := range parts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; a.restoring.Add(-1); wg.Done() }()
			restored[i] = a.restorePartition(ctx, id, resume[id])
		}()
	}
	wg.Wait()
	for _, p := range restored {
		if p != nil {
			a.parts[p.id] = p
		}
	}
	// Each new partition commits under the current count at the next
	// flush, even with nothing to count: the hand-over (handover.go).
	if a.since.IsZero() {
		a.since = time.Now()
	}
}

// restorePartition builds the state of partition id, assigned at offset
// before: from its newest usable snapshot and the events stored since, or
// else from every event stored. It returns nil when ctx ends first. The
// caller holds mu, so that nothing else changes what the restore reads
// (the overrides, the past partition counts); several restores may run
// at once under it.
func (a *aggregator) restorePartition(ctx context.Context, id int32, before int64) *partition {
	start := time.Now()
	if st, n, ok := a.loadSnapshot(ctx, id, before); ok {
		a.m.rebuildSeconds.Observe(time.Since(start).Seconds())
		a.m.rebuildEvents.Add(float64(n))
		a.log.Info("partition assigned and restored from a snapshot", "partition", id, "resume_offset", before, "events_replayed", n, "took", time.Since(start).Round(time.Millisecond))
		a.announceRestored(ctx, id, st, before)
		return a.assignedPartition(id, st, before, n)
	}
	var st *tally.Partition
	var n int
	err := a.retry(ctx, "rebuild from clickhouse", id, func() error {
		st = tally.New(id, a.cfg.options())
		st.SetPolicy(a.watcher.Current())
		st.SetReplay(true)
		// Stored events still ahead of this host's clock are held
		// again, as they were when first read.
		now := time.Now()
		st.SetClock(now)
		a.installOverrides(st, now)
		var err error
		n, err = a.store.Replay(ctx, id, before, func(ev *schemas.UsageEvent, off int64) { st.Apply(ev, off) })
		return err
	})
	if err != nil {
		a.log.Error("partition not rebuilt (client closing)", "partition", id, "err", err)
		return nil
	}
	st.SetReplay(false)
	st.ClearDirty()
	st.TakeSignals()
	a.m.rebuildSeconds.Observe(time.Since(start).Seconds())
	a.m.rebuildEvents.Add(float64(n))
	a.log.Info("partition assigned and rebuilt", "partition", id, "resume_offset", before, "events_replayed", n, "took", time.Since(start).Round(time.Millisecond))
	a.announceRestored(ctx, id, st, before)
	return a.assignedPartition(id, st, before, n)
}

// assignedPartition is partition id, restored at offset before with
// replayed events after its snapshot (or without one), and its writer.
func (a *aggregator) assignedPartition(id int32, st *tally.Partition, before int64, replayed int) *partition {
	return &partition{id: id, state: st, next: before, enqueued: before, epoch: -1, w: a.startWriter(id, before),
		snapAt: time.Now(), snapNext: snappedAt(before, replayed)}
}

// resumeOffsets returns where consumption of each partition resumes: the
// group's committed offset, or the log start when nothing was committed.
func resumeOffsets(ctx context.Context, adm *kadm.Client, group, topic string, parts []int32) (map[int32]int64, error) {
	out := map[int32]int64{}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	if err := starts.Error(); err != nil {
		return nil, err
	}
	for _, p := range parts {
		if o, ok := committed.Lookup(topic, p); ok && o.Err == nil && o.At >= 0 {
			out[p] = o.At
			continue
		}
		if o, ok := starts.Lookup(topic, p); ok {
			out[p] = o.Offset
		}
	}
	return out, nil
}

// onRevoked hands partitions over cleanly: flush, store and commit, then
// forget.
func (a *aggregator) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fctx, cancel := context.WithTimeout(ctx, a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.flushAll(fctx); err != nil {
		a.log.Warn("flush on revoke failed; the next owner re-reads from the last commit", "err", err)
	}
	a.dropHandovers(revoked[a.topics.Usage])
	a.dropFrozen(revoked[a.topics.Usage])
	for _, id := range revoked[a.topics.Usage] {
		if p := a.parts[id]; p != nil {
			if err := p.w.wait(fctx); err != nil {
				a.log.Warn("partition revoked before ClickHouse stored its rows; the next owner re-reads from the last commit", "partition", id, "err", err)
			}
			a.stop(p.w)
			p.dropRestores()
			delete(a.parts, id)
			a.m.lag.DeleteLabelValues(fmt.Sprint(id))
		}
	}
}

// onLost drops partitions another member may already own: nothing may be
// committed for them any more; what was not flushed is re-read there.
func (a *aggregator) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropHandovers(lost[a.topics.Usage])
	a.dropFrozen(lost[a.topics.Usage])
	for _, id := range lost[a.topics.Usage] {
		if p := a.parts[id]; p != nil {
			a.stop(p.w)
			p.dropRestores()
		}
		delete(a.parts, id)
		a.m.lag.DeleteLabelValues(fmt.Sprint(id))
	}
	a.log.Warn("partitions lost", "partitions", lost[a.topics.Usage])
}

package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

type aggregator struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	watcher *policy.Watcher
	store   *chstore.Store
	cl      *kgo.Client
	admin   *adminFollower
	auth    *signalauth.Auth // signs every signal record

	// mu guards parts. The poll loop holds it while processing a poll; the
	// rebalance callbacks (which franz-go runs only between polls, given
	// BlockRebalanceOnPoll) hold it while they flush or rebuild.
	mu    sync.Mutex
	parts map[int32]*partition
	since time.Time // when the oldest unflushed event was read; zero: none
	ev    schemas.UsageEvent
}

// partition is one assigned partition: its state and what is not flushed.
type partition struct {
	id      int32
	state   *tally.Partition
	batch   chstore.Batch
	next    int64 // offset after the last event processed
	flushed int64 // offset after the last event written, published and committed
	epoch   int32
	pending int // events processed since the last flush, counted or not
}

func newAggregator(cfg Config, env platform.Env, w *policy.Watcher) *aggregator {
	return &aggregator{cfg: cfg, log: env.Logger, m: newMetrics(env.Metrics, w), watcher: w, parts: map[int32]*partition{}}
}

func (a *aggregator) kafkaOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(a.cfg.Group),
		kgo.ConsumeTopics(a.cfg.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(a.cfg.SessionTimeout),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(a.onAssigned),
		kgo.OnPartitionsRevoked(a.onRevoked),
		kgo.OnPartitionsLost(a.onLost),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}
}

// costFunc prices events with the policy in force, for minute repairs.
func (a *aggregator) costFunc() chstore.CostFunc {
	pol := a.watcher.Current()
	return func(model string, at time.Time, prompt, completion, cached int64) float64 {
		if pr, ok := pol.Price(model, at); ok {
			return pr.Cost(prompt, completion, cached)
		}
		return 0
	}
}

func (a *aggregator) loop(ctx context.Context) {
	for ctx.Err() == nil {
		wait := a.cfg.FlushInterval
		a.mu.Lock()
		if !a.since.IsZero() {
			wait = max(time.Until(a.since.Add(a.cfg.FlushInterval)), time.Millisecond)
		}
		a.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, wait)
		fetches := a.cl.PollRecords(pctx, a.cfg.BatchEvents)
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
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) { a.process(ctx, ftp) })
		if !a.since.IsZero() && (a.pendingMax() >= a.cfg.BatchEvents || time.Since(a.since) >= a.cfg.FlushInterval) {
			if err := a.flushAll(ctx); err != nil && ctx.Err() == nil {
				a.log.Error("flush failed", "err", err)
			}
		}
		a.mu.Unlock()
		a.cl.AllowRebalance()
	}
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
	pol := a.watcher.Current()
	p.state.SetPolicy(pol)
	before := p.state.Stats
	now := time.Now()
	for _, rec := range ftp.Records {
		if rec.Offset < p.next {
			continue // re-delivered after a retry inside the client
		}
		ev := &a.ev
		if err := eventjson.DecodeUsageEvent(rec.Value, ev); err != nil {
			a.m.invalid.Inc()
			a.log.Warn("skipping an undecodable usage event", "partition", rec.Partition, "offset", rec.Offset, "err", err)
		} else {
			// The future bound is measured from the record's time, capped
			// by this host's clock (a producer's clock may be wrong too).
			ref := now
			if rec.Timestamp.After(time.Unix(0, 0)) && rec.Timestamp.Before(now) {
				ref = rec.Timestamp
			}
			p.state.SetClock(ref)
			r := p.state.Apply(ev, rec.Offset)
			if r == tally.Evicted {
				if !a.restore(ctx, p, ev.Tenant, rec.Offset) {
					// Only a cancelled ctx gets here, which ends the poll
					// loop: stop before this record; the final flush
					// commits what came before and the rest is read again.
					break
				}
				r = p.state.Apply(ev, rec.Offset)
			}
			if r == tally.TooFarAhead {
				a.log.Warn("refusing a usage event stamped too far ahead: the hold of future events is full (aggregator.future_hold_capacity); fix the producer's clock",
					"partition", rec.Partition, "offset", rec.Offset, "tenant", ev.Tenant, "id", ev.ID, "time", ev.Time, "reference", ref)
			}
			if r == tally.Accepted || r == tally.Held {
				if p.batch.Events == nil {
					p.batch.Events = make([]chstore.Event, 0, a.cfg.BatchEvents)
				}
				p.batch.Events = append(p.batch.Events, chstore.Event{UsageEvent: *ev, Partition: rec.Partition, Offset: rec.Offset})
			}
		}
		p.next, p.epoch = rec.Offset+1, rec.LeaderEpoch
		p.pending++
	}
	after := p.state.Stats
	a.m.restores.Add(float64(after.RestoredTenants - before.RestoredTenants))
	a.m.accepted.Add(float64(after.Accepted - before.Accepted))
	a.m.duplicates.Add(float64(after.Duplicates - before.Duplicates))
	a.m.rejected.Add(float64(after.Rejected - before.Rejected))
	a.m.late.Add(float64(after.Late - before.Late))
	a.m.held.Add(float64(after.Held - before.Held))
	a.m.released.Add(float64(after.Released - before.Released))
	a.m.tooFarAhead.Add(float64(after.Refused - before.Refused))
	a.m.lag.WithLabelValues(fmt.Sprint(ftp.Partition)).Set(float64(max(ftp.HighWatermark-p.next, 0)))
	if a.since.IsZero() {
		a.since = time.Now()
	}
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
		before := len(p.state.PendingSignals())
		p.state.Reevaluate(pol)
		signals += len(p.state.PendingSignals()) - before
	}
	a.markPending()
	a.m.reevaluations.Inc()
	a.log.Info("policy applied to every tenant in memory", "file", pol.Source(), "partitions", len(a.parts), "signals", signals, "took", time.Since(start).Round(time.Microsecond))
}

// flushAll flushes every partition with something pending, in partition
// order.
func (a *aggregator) flushAll(ctx context.Context) error {
	ids := make([]int32, 0, len(a.parts))
	for id := range a.parts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	// Partitions are independent, so their flushes run in parallel: the
	// ClickHouse inserts and commits of one do not wait for another's.
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { errs[i] = a.flush(ctx, a.parts[id]) })
	}
	wg.Wait()
	a.since = time.Time{}
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
	return errors.Join(errs...)
}

// flush writes a partition's pending rows to ClickHouse, then produces its
// signals, then commits its offset: each step only after the one before
// succeeded, retrying with back-off until it does or ctx ends.
func (a *aggregator) flush(ctx context.Context, p *partition) error {
	if p.next == p.flushed && !p.state.Pending() {
		return nil
	}
	b := &p.batch
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
	}
	b.Version = uint64(p.next)
	rows := len(b.Events) + len(b.Minutes) + len(b.Quotas)

	start := time.Now()
	if err := a.retry(ctx, "clickhouse write", p.id, func() error { return a.store.Write(ctx, b) }); err != nil {
		return err
	}
	a.m.writeRows.Observe(float64(rows))
	a.m.writeSeconds.Observe(time.Since(start).Seconds())

	if len(b.Signals) > 0 {
		recs := make([]*kgo.Record, len(b.Signals))
		for i := range b.Signals {
			s := &b.Signals[i]
			recs[i] = a.auth.Record(a.cfg.SignalsTopic, []byte(s.Tenant), b.Payloads[i])
			a.m.signals.WithLabelValues(string(s.Kind)).Inc()
		}
		if err := a.retry(ctx, "produce signals", p.id, func() error { return a.cl.ProduceSync(ctx, recs...).FirstErr() }); err != nil {
			return err
		}
	}

	commit := map[string]map[int32]kgo.EpochOffset{a.cfg.Topic: {p.id: {Epoch: p.epoch, Offset: p.next}}}
	var cerr error
	a.cl.CommitOffsetsSync(ctx, commit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		cerr = commitErr(resp, err)
	})
	if cerr != nil {
		// Not fatal: ClickHouse holds the rows, so the next owner rebuilds
		// them and at worst re-reads (and re-signals, same ids) the events.
		a.m.commitErrors.Inc()
		return fmt.Errorf("partition %d: commit offset %d: %w", p.id, p.next, cerr)
	}
	p.flushed = p.next
	p.pending = 0
	b.Reset()
	// Everything the state changed is stored now, so idle tenants can go.
	if n := p.state.EvictIdle(); n > 0 {
		a.m.evictions.Add(float64(n))
	}
	return nil
}

// restore rebuilds an evicted tenant from its events stored below offset,
// retrying while ClickHouse is unreachable. It reports false when ctx ended
// first.
func (a *aggregator) restore(ctx context.Context, p *partition, tenant string, offset int64) bool {
	start := time.Now()
	err := a.retry(ctx, "restore tenant from clickhouse", p.id, func() error {
		return p.state.Restore(tenant, func(apply func(*schemas.UsageEvent, int64)) error {
			_, err := a.store.ReplayTenant(ctx, p.id, tenant, offset, apply)
			return err
		})
	})
	if err != nil {
		a.log.Warn("evicted tenant not restored (shutting down)", "partition", p.id, "tenant", tenant, "err", err)
		return false
	}
	a.m.restoreSeconds.Observe(time.Since(start).Seconds())
	return true
}

func (a *aggregator) retry(ctx context.Context, what string, part int32, fn func() error) error {
	wait := a.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		a.m.writeErrors.WithLabelValues(what).Inc()
		a.log.Warn(what+" failed; retrying, fetching paused", "partition", part, "attempt", attempt, "retry_in", wait, "err", err)
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
	parts := assigned[a.cfg.Topic]
	if len(parts) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	adm := kadm.NewClient(cl)
	var resume map[int32]int64
	_ = a.retry(ctx, "fetch committed offsets", -1, func() error {
		var err error
		resume, err = resumeOffsets(ctx, adm, a.cfg.Group, a.cfg.Topic, parts)
		return err
	})
	for _, id := range parts {
		start := time.Now()
		st := tally.New(id, a.cfg.options())
		st.SetPolicy(a.watcher.Current())
		st.SetReplay(true)
		before := resume[id]
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
			continue
		}
		st.SetReplay(false)
		st.ClearDirty()
		st.TakeSignals()
		a.parts[id] = &partition{id: id, state: st, next: before, flushed: before, epoch: -1}
		a.m.rebuildSeconds.Observe(time.Since(start).Seconds())
		a.m.rebuildEvents.Add(float64(n))
		a.log.Info("partition assigned and rebuilt", "partition", id, "resume_offset", before, "events_replayed", n, "took", time.Since(start).Round(time.Millisecond))
	}
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

// onRevoked hands partitions over cleanly: flush and commit, then forget.
func (a *aggregator) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range revoked[a.cfg.Topic] {
		if p := a.parts[id]; p != nil {
			fctx, cancel := context.WithTimeout(ctx, a.cfg.ShutdownGrace)
			if err := a.flush(fctx, p); err != nil {
				a.log.Warn("flush on revoke failed; the next owner re-reads from the last commit", "partition", id, "err", err)
			}
			cancel()
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
	for _, id := range lost[a.cfg.Topic] {
		delete(a.parts, id)
		a.m.lag.DeleteLabelValues(fmt.Sprint(id))
	}
	a.log.Warn("partitions lost", "partitions", lost[a.cfg.Topic])
}

// commitErr returns the request error or the first partition error of an
// offset commit.
func commitErr(resp *kmsg.OffsetCommitResponse, err error) error {
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return err
			}
		}
	}
	return nil
}

package aggregator

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// A tenant evicted as idle that sends again is rebuilt from ClickHouse
// beside the poll loop, not in it: the query (a month of the tenant's
// events, retried for as long as ClickHouse is unreachable) used to hold
// every partition of the instance — no event counted, no signal published
// — until it returned. Now only the returning tenant's events wait, parked
// in arrival order, and are counted once its stored events are replayed;
// every other tenant's events are counted meanwhile.
//
// A tenant whose home moved here when the topic gained partitions is
// rebuilt the same way, from what its old homes stored, once the hand-over
// allows it (handover.go): until its old homes committed under the new
// partition count the partition stops at the tenant's first event; after
// that only the tenant's events wait for the query.
//
// Exactly-once is kept by committing no offset past the first parked
// event (partition.committable): a crash or a revoke before the restore
// ends re-reads the parked events, and the events of other tenants after
// them, which ClickHouse versions fold as on every re-read.

// maxParkedEvents bounds the events of one partition waiting for their
// tenants' restores. Beyond it the poll loop waits for those restores (the
// old behaviour, for a partition whose returning tenants flood it while
// ClickHouse is away), so memory stays bounded.
const maxParkedEvents = 100_000

// pendingRestore is one evicted or moved tenant being rebuilt.
type pendingRestore struct {
	tenant string
	offset int64 // of the event that found it evicted: the replay reads below it
	start  time.Time
	parked []parkedEvent // the tenant's events read meanwhile, in offset order

	done chan struct{} // closed once events or err is set
	// Set by the restore's goroutine before done is closed.
	events []restoredEvent
	// announced is what quota_state says was announced for the tenant's
	// open periods (see announceRestored).
	announced map[tally.AnnouncedKey]tally.Announced
	err       error
}

// parkedEvent is an event waiting for its tenant's restore.
type parkedEvent struct {
	ev        schemas.UsageEvent
	partition int32
	offset    int64
	ref       time.Time // the clock the event was read under
}

// restoredEvent is a stored event the restore replays.
type restoredEvent struct {
	ev     schemas.UsageEvent
	offset int64
}

func (r *pendingRestore) park(p *partition, ev *schemas.UsageEvent, part int32, offset int64, ref time.Time) {
	r.parked = append(r.parked, parkedEvent{ev: *ev, partition: part, offset: offset, ref: ref})
	p.parked++
}

// startRestore starts rebuilding ev's tenant — evicted from p, or moved to
// p and handed over — from what ClickHouse stored for it (below ev's
// offset on p, and on its other partitions), and parks ev until it is done.
func (a *aggregator) startRestore(p *partition, ev *schemas.UsageEvent, part int32, offset int64, ref time.Time) {
	if p.restoring == nil {
		p.restoring = map[string]*pendingRestore{}
		p.rctx, p.rcancel = context.WithCancel(context.Background())
	}
	r := &pendingRestore{tenant: ev.Tenant, offset: offset, start: time.Now(), done: make(chan struct{})}
	r.park(p, ev, part, offset, ref)
	p.restoring[ev.Tenant] = r
	ctx, id := p.rctx, p.id
	go func() {
		r.err = a.retry(ctx, "restore tenant from clickhouse", id, func() error {
			r.events = r.events[:0]
			_, err := a.store.ReplayTenant(ctx, id, r.tenant, r.offset, func(ev *schemas.UsageEvent, off int64) {
				r.events = append(r.events, restoredEvent{ev: *ev, offset: off})
			})
			if err == nil {
				r.announced, err = a.store.Announced(ctx, r.tenant, time.Now())
			}
			return err
		})
		close(r.done)
		a.kickPoll()
	}()
}

// announceRestored has a partition state just restored (rebuilt from
// ClickHouse or from a snapshot) announce what it says that was not
// announced before (tally.AnnounceRestored): a limit lowered, or an
// override expired, while no aggregator ran puts tenants at 100% with no
// tier crossing, so without this nothing would block them. quota_state
// holds what the previous owners announced; reading it is retried like the
// rebuild. The signals go out with the partition's first flush.
func (a *aggregator) announceRestored(ctx context.Context, id int32, st *tally.Partition, offset int64) {
	var announced map[tally.AnnouncedKey]tally.Announced
	if err := a.retry(ctx, "read the announced quota state from clickhouse", id, func() error {
		var err error
		announced, err = a.store.Announced(ctx, "", time.Now())
		return err
	}); err != nil {
		return // the client is closing: the partition is not used
	}
	if n := st.AnnounceRestored("", announced, offset); n > 0 {
		a.m.restoreAnnouncements.Add(float64(n))
		a.log.Info("restored quota state differs from what was announced; announcing it", "partition", id, "signals", n)
	}
}

// committable is the offset p may commit: the next to read, or the first
// event still waiting for its tenant's restore.
func (p *partition) committable() int64 {
	next := p.next
	for _, r := range p.restoring {
		next = min(next, r.offset)
	}
	return next
}

// finishRestores applies every restore that has ended. The poll loop calls
// it, holding a.mu, before the events of a new poll.
func (a *aggregator) finishRestores() {
	for _, p := range a.parts {
		for _, r := range p.restoring {
			select {
			case <-r.done:
				a.finishRestore(p, r)
			default:
			}
		}
	}
}

// awaitRestores waits for every restore of p and applies it. It reports
// false when ctx ended first.
func (a *aggregator) awaitRestores(ctx context.Context, p *partition) bool {
	a.log.Warn("events waiting for restores from ClickHouse reached their bound; the partition waits for the restores", "partition", p.id, "parked", p.parked, "tenants", len(p.restoring))
	for _, r := range p.restoring {
		select {
		case <-r.done:
			a.finishRestore(p, r)
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// finishRestore rebuilds r's tenant from the events its restore read, then
// counts the tenant's parked events in order.
func (a *aggregator) finishRestore(p *partition, r *pendingRestore) {
	delete(p.restoring, r.tenant)
	p.parked -= len(r.parked)
	if r.err != nil {
		// Only a cancelled restore gets here, and only dropRestores cancels:
		// the parked events were never committed, the next owner reads them.
		return
	}
	before := p.state.Stats
	// Replaying from memory cannot fail.
	_ = p.state.Restore(r.tenant, func(apply func(*schemas.UsageEvent, int64)) error {
		for i := range r.events {
			apply(&r.events[i].ev, r.events[i].offset)
		}
		return nil
	})
	a.m.restoreSeconds.Observe(time.Since(r.start).Seconds())
	if n := p.state.AnnounceRestored(r.tenant, r.announced, r.offset); n > 0 {
		a.m.restoreAnnouncements.Add(float64(n))
		a.log.Info("restored tenant's quota state differs from what was announced; announcing it", "partition", p.id, "tenant", r.tenant, "signals", n)
		if a.since.IsZero() {
			a.since = time.Now()
		}
	}
	for i := range r.parked {
		pe := &r.parked[i]
		p.state.SetClock(pe.ref)
		if res := a.count(p, &pe.ev, pe.partition, pe.offset, pe.ref); res == tally.Evicted {
			// Restore made the tenant known; this cannot happen.
			a.log.Error("a restored tenant is evicted again; event skipped, will be re-read after a restart", "partition", p.id, "tenant", r.tenant, "offset", pe.offset)
		}
	}
	a.countStats(before, p.state.Stats)
	if a.since.IsZero() && len(r.parked) > 0 {
		a.since = time.Now()
	}
}

// dropRestores abandons p's restores when p is revoked, lost or shut down.
func (p *partition) dropRestores() {
	if p.rcancel != nil {
		p.rcancel()
	}
	p.restoring, p.parked = nil, 0
}

// setKick registers the cancel of the poll loop's current wait (nil: none).
// A restore that ended before the wait began cuts it short at once.
func (a *aggregator) setKick(cancel context.CancelFunc) {
	a.kickMu.Lock()
	a.kick = cancel
	a.kickMu.Unlock()
	if cancel == nil {
		return
	}
	select {
	case <-a.restored:
		cancel()
	default:
	}
}

// kickPoll wakes the poll loop so that an ended restore is applied without
// waiting for the next fetch or flush.
func (a *aggregator) kickPoll() {
	select {
	case a.restored <- struct{}{}:
	default:
	}
	a.kickMu.Lock()
	if a.kick != nil {
		a.kick()
	}
	a.kickMu.Unlock()
}

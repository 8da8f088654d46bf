package tally

import (
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Idle eviction.
//
// A tenant that has sent nothing for Options.IdleEvict of event time
// (behind the latest event the partition applied) is dropped from memory
// with all its series, so state is bounded by the tenants active recently,
// not by every tenant ever seen. Its totals are in ClickHouse: EvictIdle
// runs only when everything the state changed has been written. When the
// tenant sends again, Apply answers Evicted; the caller replays the
// tenant's stored events into Restore (as a partition rebuild does for all
// tenants) and applies the event again. Because the tenant's state is a
// function of its own events in offset order, the restored state — totals,
// tiers, predictions, anomaly windows — is the one it would have had
// without the eviction, and so are the signals that follow.

// evictedMemory is how long an evicted tenant is remembered as such: as
// far back as a rebuild replays (the previous calendar month) and a margin.
const evictedMemory = 62 * 24 * 3600

// EvictIdle forgets the tenants idle for longer than Options.IdleEvict of
// event time and returns how many tenant × model series it dropped
// (tenant-wide "*" series included). Call it only when nothing is pending:
// after Drain, once the drained rows are stored. Tenants with undrained
// changes or held events are kept (a released event must find its tenant). It scans at most once per minute of event time.
func (p *Partition) EvictIdle() int {
	idle := int64(p.opt.IdleEvict / time.Second)
	if idle <= 0 || p.wm-p.lastScan < 60 {
		return 0
	}
	p.lastScan = p.wm
	n := 0
	holding := p.holding()
	for id, t := range p.tenants {
		if t.wm >= p.wm-idle || t.pending() || holding[id] {
			continue
		}
		n += len(t.order)
		p.drop(t)
		delete(p.tenants, id)
		p.evicted[p.tenantKey(id)] = t.wm
	}
	for k, last := range p.evicted {
		if last < p.wm-evictedMemory {
			delete(p.evicted, k)
		}
	}
	p.Stats.EvictedSeries += int64(n)
	return n
}

// pending reports whether a series of t holds changes not drained yet.
func (t *tenant) pending() bool {
	for _, s := range t.order {
		if s.dirty {
			return true
		}
		for i := range s.roll {
			if s.roll[i].dirty {
				return true
			}
		}
	}
	return false
}

// drop frees t's series slots. Remembered ids keep pointing at the freed
// slots until a restore re-attaches them or the FIFO forgets them.
func (p *Partition) drop(t *tenant) {
	for _, s := range t.order {
		p.series[s.idx] = nil
		p.free = append(p.free, s.idx)
		s.t = nil
	}
}

// Evicted reports whether tenant is evicted and must be restored before
// its next event is applied.
func (p *Partition) Evicted(tenant string) bool {
	if _, known := p.tenants[tenant]; known || len(p.evicted) == 0 {
		return false
	}
	_, gone := p.evicted[p.tenantKey(tenant)]
	return gone
}

// Known reports whether tenant has state in this partition (it is neither
// evicted nor new here).
func (p *Partition) Known(tenant string) bool {
	_, ok := p.tenants[tenant]
	return ok
}

// Restore rebuilds an evicted tenant, or one this partition has not seen
// yet whose events may be stored under another partition (the topic gained
// partitions and moved the tenant's home). replay must call apply with each
// of the tenant's distinct stored events (latest version per id) below the
// offset of the event that brought the tenant here, in the order they were
// counted, as the Store's tenant replay does. No signals are emitted and no
// rows are produced: ClickHouse holds them. If replay fails, the partial
// state is dropped and the tenant stays evicted (or unknown), so Restore
// can be retried.
func (p *Partition) Restore(tenant string, replay func(apply func(ev *schemas.UsageEvent, offset int64)) error) error {
	if p.Known(tenant) {
		return nil
	}
	key := p.tenantKey(tenant)
	last, wasEvicted := p.evicted[key]
	delete(p.evicted, key)
	stats, wasReplay := p.Stats, p.replay
	p.replay, p.restoring, p.restored, p.restoreNew = true, true, map[uint64]idRec{}, !wasEvicted
	err := replay(func(ev *schemas.UsageEvent, offset int64) {
		if ev.Tenant == tenant {
			p.Apply(ev, offset)
		}
	})
	p.replay, p.restoring, p.restored, p.restoreNew, p.Stats = wasReplay, false, nil, false, stats
	t := p.tenants[tenant]
	if err != nil {
		if t != nil {
			p.drop(t)
			delete(p.tenants, tenant)
		}
		if wasEvicted {
			p.evicted[key] = last
		}
		return err
	}
	if t != nil {
		for _, s := range t.order {
			for i := range s.roll {
				s.roll[i].dirty = false
			}
			s.prevDirty = [3]bool{}
		}
	}
	p.Stats.RestoredTenants++
	return nil
}

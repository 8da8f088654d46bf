package tally

import (
	"sort"
	"strconv"

	"github.com/sluicehq/sluice/schemas"
)

// Announcing a restored state.
//
// A state rebuilt from ClickHouse (or restored from a snapshot, or a
// tenant restored after eviction) counts its events in replay mode, which
// emits no signals: they were emitted when the events were first read.
// But the replay applies the policy and overrides in force now, not those
// of then. A limit lowered while every aggregator was down, or an override
// that expired meanwhile, puts the rebuilt tier at 100 with no crossing —
// nothing announces it, so nothing enforces it, and the next events find
// the tier already there. AnnounceRestored compares what the restored
// state says with what was announced before (the quota_state rows the
// previous owner wrote with its signals) and emits what differs — where
// the limit differs too. Under the limit the previous owner had, the
// replay's tier may differ from the live one without anything to
// announce: the replay sees only settlements, not the estimates that
// pushed the live tier up (and hysteresis held it there), and those
// signals went out already.

// Announced is what was last announced for one quota period: its tier,
// whether it was exhausted, and under which limit.
type Announced struct {
	Tier      int
	Exhausted bool
	Limit     float64
}

// AnnouncedKey names one quota period of a tenant × model.
type AnnouncedKey struct {
	Tenant, Model, Quota string
	PeriodStart          int64 // unix seconds
}

// AnnounceRestored emits, for every quota period still open on the
// reference clock of tenant's series (every tenant's when tenant is ""),
// the signals that bring consumers from what prior says was announced to
// what the state holds: a tier_crossed when the tier differs, a
// quota_exhausted when the quota is used up and was not announced so.
// Nothing is announced for a period whose entry in prior has the limit in
// force now (see above). A period without an entry was announced at tier
// 0, not exhausted (under the same limit the restored state is then at
// tier 0 too: a replay's tier is never above the live one). offset is
// where consumption resumes, which the signals name;
// their ids derive from it, so a second restore at the same offset
// announces under the same ids. It returns how many signals it emitted.
func (p *Partition) AnnounceRestored(tenant string, prior map[AnnouncedKey]Announced, offset int64) int {
	if p.replay {
		return 0
	}
	ids := []string{tenant}
	if tenant == "" {
		ids = make([]string, 0, len(p.tenants))
		for id := range p.tenants {
			ids = append(ids, id)
		}
		sort.Strings(ids) // signals in a deterministic order
	}
	before := len(p.signals)
	for _, id := range ids {
		t, ok := p.tenants[id]
		if !ok || !t.started {
			continue
		}
		for _, s := range t.order {
			for i := range s.quotas {
				if q := &s.quotas[i]; q.kind != kindMinute {
					s.announceRestored(q, prior, offset, p)
				}
			}
		}
	}
	return len(p.signals) - before
}

func (s *Series) announceRestored(q *quotaState, prior map[AnnouncedKey]Announced, offset int64, p *Partition) {
	b := s.t.bounds[q.kind][0]
	if p.now != 0 && b.end <= p.now {
		return // the period ended during the outage: its next event rolls it
	}
	was, ok := prior[AnnouncedKey{s.t.id, s.model, string(q.q.Name), b.start}]
	if ok && was.Limit == q.q.Limit {
		return // announced under the same limit: the signals went out
	}
	ts, used := s.t.wm, s.used(q, 0)
	if q.tier != was.Tier {
		sig := s.base(schemas.SignalTierCrossed, q, b, ts, offset, used)
		sig.PreviousTier, sig.Direction = was.Tier, schemas.DirectionUp
		if q.tier < was.Tier {
			sig.Direction = schemas.DirectionDown
		}
		if q.crossings > 0 && q.fromTier == was.Tier {
			// The replay's last crossing is the one not announced (or
			// announced with rows that never reached quota_state, a crash
			// between the two): the id it had, or would have had, live.
			sig.ID = s.id(sig.Kind, q, b.start, strconv.Itoa(q.fromTier), strconv.Itoa(q.tier), strconv.Itoa(int(q.crossings)))
		} else {
			sig.ID = s.id(sig.Kind, q, b.start, strconv.Itoa(was.Tier), strconv.Itoa(q.tier), "restored", strconv.FormatInt(offset, 10))
		}
		sig.Reason = string(q.q.Name) + " at tier " + strconv.Itoa(q.tier) + " after a restore under the limit in force (" +
			strconv.FormatFloat(q.q.Limit, 'f', -1, 64) + "); tier " + strconv.Itoa(was.Tier) + " was announced before"
		p.emit(sig)
	}
	if q.exhausted && !was.Exhausted {
		// The id an exhaustion counted live would have had.
		sig := s.exhaustion(q, b, ts, offset, used)
		sig.Reason += ", found after a restore under the limit now in force"
		p.emit(sig)
	}
	if q.tier != was.Tier || q.exhausted != was.Exhausted {
		p.markDirty(s) // quota_state shows what was announced
	}
}

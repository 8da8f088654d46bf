package tally

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

type applied struct {
	ev  schemas.UsageEvent
	off int64
}

// storeSim keeps what the aggregator writes to ClickHouse: every counted
// version of each event, so a tenant replay can return the latest.
type storeSim struct{ rows []applied }

func (s *storeSim) apply(p *Partition, e *schemas.UsageEvent, off int64) Result {
	r := p.Apply(e, off)
	if r == Accepted {
		s.rows = append(s.rows, applied{*e, off})
	}
	return r
}

// replay is chstore.ReplayTenant over the simulated table.
func (s *storeSim) replay(tenant string, before int64) func(func(*schemas.UsageEvent, int64)) error {
	return func(apply func(*schemas.UsageEvent, int64)) error {
		latest := map[string]int{}
		for i, r := range s.rows {
			if r.ev.Tenant == tenant && r.off < before {
				latest[r.ev.ID] = i
			}
		}
		for i, r := range s.rows {
			if latest[r.ev.ID] == i && r.ev.Tenant == tenant && r.off < before {
				e := r.ev
				apply(&e, r.off)
			}
		}
		return nil
	}
}

// TestEvictedTenantRestoresExactly: a tenant idle past idle_evict_after is
// dropped; when it returns, replaying its stored events restores totals,
// dedup and settlements, and the signals that follow are exactly those of
// a partition that never evicted it.
func TestEvictedTenantRestoresExactly(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	keep := New(0, Options{Hysteresis: 5, Horizon: 6 * time.Hour, DedupCapacity: 100_000, SlowCallMS: 10_000, SpikeMultiplier: 10, SpikeMinTokens: 1000})
	keep.SetPolicy(pol)
	opt := keep.opt
	opt.IdleEvict = 2 * time.Hour
	evict := New(0, opt)
	evict.SetPolicy(pol)
	var db storeSim

	var stream []*schemas.UsageEvent
	// acme: 40 minutes of traffic with errors, an unsettled estimate and
	// enough tokens to cross tiers; "busy" keeps the partition's clock going.
	for i := 0; i < 240; i++ {
		e := ev(fmt.Sprintf("a%d", i), t0.Add(time.Duration(i)*10*time.Second), 5+int64(i%7), 3)
		if i%3 == 0 {
			e.Outcome = schemas.OutcomeError
		}
		stream = append(stream, e)
	}
	est := ev("pending", t0.Add(41*time.Minute), 300, 0)
	est.Estimated = true
	stream = append(stream, est)
	for i := 0; i < 200; i++ {
		b := ev(fmt.Sprintf("b%d", i), t0.Add(41*time.Minute+time.Duration(i)*time.Minute), 10, 10)
		b.Tenant = "busy"
		stream = append(stream, b)
	}
	// acme returns the same day: a retry of an old event, the estimate's
	// settlement, new calls.
	back := t0.Add(4 * time.Hour)
	stream = append(stream, ev("a5", t0.Add(50*time.Second), 5+5, 3))
	stream = append(stream, ev("pending", est.Time, 40, 2))
	for i := 0; i < 60; i++ {
		e := ev(fmt.Sprintf("r%d", i), back.Add(time.Duration(i)*5*time.Second), 20, 5)
		if i%2 == 0 {
			e.Outcome = schemas.OutcomeTimeout
		}
		stream = append(stream, e)
	}

	var wantSigs, gotSigs []string
	evictedAt := -1
	for i, e := range stream {
		off := int64(i)
		keep.Apply(e, off)
		r := db.apply(evict, e, off)
		if r == Evicted {
			if err := evict.Restore(e.Tenant, db.replay(e.Tenant, off)); err != nil {
				t.Fatal(err)
			}
			if r = db.apply(evict, e, off); r == Evicted {
				t.Fatalf("offset %d: still evicted after Restore", off)
			}
		}
		if want := map[int]Result{441: Duplicate, 442: Accepted}[i]; (i == 441 || i == 442) && r != want {
			t.Errorf("offset %d (%s) after restore: %v, want %v (retry, settlement)", off, e.ID, r, want)
		}
		for _, s := range keep.TakeSignals() {
			wantSigs = append(wantSigs, fingerprint(&s))
		}
		for _, s := range evict.TakeSignals() {
			gotSigs = append(gotSigs, fingerprint(&s))
		}
		// The aggregator evicts after each flush; flush every event here.
		var rows Rows
		evict.Drain(&rows)
		if evict.EvictIdle() > 0 && evictedAt < 0 {
			evictedAt = i
		}
	}
	if evictedAt < 0 || evict.Stats.EvictedSeries < 2 || evict.Stats.RestoredTenants != 1 {
		t.Fatalf("acme was not evicted and restored: evicted at %d, stats %+v", evictedAt, evict.Stats)
	}
	if evictedAt < 240+120 {
		t.Errorf("evicted at offset %d, before two hours of event time had passed", evictedAt)
	}
	for _, model := range []string{"gpt-4o", "*"} {
		for _, per := range []string{"hour", "day", "month"} {
			kt, kr, kc, ks, _ := keep.Totals("acme", model, per)
			et, er, ec, es, ok := evict.Totals("acme", model, per)
			if !ok || kt != et || kr != er || kc != ec || !ks.Equal(es) {
				t.Errorf("acme/%s %s: restored %d tokens %d requests %v cost from %v; never evicted %d %d %v from %v", model, per, et, er, ec, es, kt, kr, kc, ks)
			}
		}
	}
	if len(wantSigs) < 5 {
		t.Fatalf("only %d signals: too tame to compare", len(wantSigs))
	}
	if fmt.Sprint(gotSigs) != fmt.Sprint(wantSigs) {
		t.Errorf("signals with eviction differ from a run without:\n got %d %v\nwant %d %v", len(gotSigs), gotSigs, len(wantSigs), wantSigs)
	}
	if keep.Stats.Accepted != evict.Stats.Accepted || keep.Stats.Duplicates != evict.Stats.Duplicates || keep.Stats.Settled != evict.Stats.Settled {
		t.Errorf("stats differ: never evicted %+v, evicted %+v", keep.Stats, evict.Stats)
	}
}

// TestStateBoundedWhenTenantsGoIdle: a stream of tenants that each send a
// little and go quiet keeps only the recently active ones in memory, and
// series slots are reused rather than grown.
func TestStateBoundedWhenTenantsGoIdle(t *testing.T) {
	opt := DefaultOptions()
	opt.IdleEvict = time.Hour
	p := partUnder(t, opt, testPolicy)
	maxSeries := 0
	var rows Rows
	for i := 0; i < 5000; i++ {
		e := ev(fmt.Sprintf("id%d", i), t0.Add(time.Duration(i)*time.Minute), 10, 0)
		e.Tenant = fmt.Sprintf("tenant-%d", i)
		p.Apply(e, int64(i))
		p.Drain(&rows)
		rows.Reset()
		p.TakeSignals()
		p.EvictIdle()
		s, _ := p.Entries()
		maxSeries = max(maxSeries, s)
	}
	// One tenant a minute, one hour kept, scans once a minute: about 61
	// tenants of two series each.
	if maxSeries > 2*63 {
		t.Errorf("up to %d series in memory, want about 122 (the last hour's tenants)", maxSeries)
	}
	if len(p.series) > 2*64 {
		t.Errorf("series slots grew to %d, want them reused", len(p.series))
	}
	if int(p.Stats.EvictedSeries) < 2*(5000-62) {
		t.Errorf("evicted %d series, want nearly all of 10000", p.Stats.EvictedSeries)
	}
}

// TestRestoreCountsAnIdStoredUnderTwoPartitionsOnce: a tenant moved by
// added partitions is restored from what every partition stored, and an
// id sent again across the change (a retry that the producer's new view
// put on the new home) is stored under both: it counts once, and an
// estimate on the old home is replaced by its settlement on the new.
func TestRestoreCountsAnIdStoredUnderTwoPartitionsOnce(t *testing.T) {
	p := newPart(t)
	at := t0.Add(10 * time.Minute)
	est := ev("e1", at, 2000, 0)
	est.Estimated = true
	stored := []applied{
		{*ev("a", at, 100, 0), 5},                    // old home
		{*ev("b", at, 200, 0), 6},                    // old home
		{*est, 7},                                    // old home: an estimate
		{*ev("b", at, 200, 0), 3},                    // new home: the retry of b
		{*ev("e1", at.Add(time.Second), 150, 50), 4}, // new home: e1 settled
	}
	if err := p.Restore("acme", func(apply func(*schemas.UsageEvent, int64)) error {
		for _, r := range stored {
			e := r.ev
			apply(&e, r.off)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := totals(t, p, "*", "hour"); got != 100+200+200 {
		t.Fatalf("restored hour total %d, want %d: each id once, the estimate replaced by its settlement", got, 500)
	}
	// The ids restored are known: a further retry is a duplicate.
	if r := p.Apply(ev("b", at, 200, 0), 8); r != Duplicate {
		t.Fatalf("a retry after the restore: %v, want Duplicate", r)
	}
}

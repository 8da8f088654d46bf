package tally

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// One event stamped far ahead must not roll the tenant's hour, day or
// month (the reported reproduction: month total from 500 to 1). It is held,
// uncounted, until the clock comes within MaxFuture of it, then counted in
// its own period.
func TestFutureEventDoesNotRollPeriods(t *testing.T) {
	p := newPart(t)
	now := t0.Add(30 * time.Second)
	for i := range 5 {
		p.SetClock(now)
		if r := p.Apply(ev(fmt.Sprintf("ok%d", i), t0.Add(time.Duration(i)*time.Second), 100, 0), int64(i)); r != Accepted {
			t.Fatalf("event %d: %v", i, r)
		}
	}
	p.TakeSignals()
	ahead := ev("ahead", t0.Add(40*24*time.Hour), 1, 0) // a gateway clock 40 days fast
	if r := p.Apply(ahead, 5); r != Held {
		t.Errorf("event 40 days ahead: %v, want Held", r)
	}
	for _, per := range []string{"hour", "day", "month"} {
		if got := totals(t, p, "*", per); got != 500 {
			t.Errorf("%s total after a future event = %d, want 500 (the outlier must not roll it)", per, got)
		}
	}
	if sigs := kinds(p.TakeSignals(), schemas.SignalPeriodReset); len(sigs) != 0 {
		t.Errorf("period_reset signals from one future event: %+v", sigs)
	}
	// Events of the present keep counting in the present periods.
	p.SetClock(now.Add(time.Minute))
	p.Apply(ev("ok5", t0.Add(time.Minute), 100, 0), 6)
	if got := totals(t, p, "*", "hour"); got != 600 {
		t.Errorf("hour total = %d, want 600", got)
	}
	if p.Held() != 1 || p.Stats.Held != 1 {
		t.Fatalf("held = %d, stats %+v", p.Held(), p.Stats)
	}
	// When the clock comes within MaxFuture of it, it is counted in its
	// own period.
	p.SetClock(ahead.Time.Add(-time.Minute))
	if p.Held() != 0 || p.Stats.Released != 1 {
		t.Fatalf("not released: held %d, stats %+v", p.Held(), p.Stats)
	}
	tok, _, _, start, _ := p.Totals("acme", "*", "hour")
	if tok != 1 || !start.Equal(ahead.Time.Truncate(time.Hour)) {
		t.Errorf("after release: hour total %d from %v, want 1 from %v", tok, start, ahead.Time.Truncate(time.Hour))
	}
	// A retry of the released id is a duplicate, held or not.
	if r := p.Apply(ahead, 9); r != Duplicate {
		t.Errorf("retry of a released event: %v, want Duplicate", r)
	}
}

// With no future bound at ingest (max_event_future: 0), one future event
// used to advance the partition's clock and evict every tenant on it.
func TestFutureEventDoesNotEvictThePartition(t *testing.T) {
	opt := DefaultOptions()
	opt.IdleEvict = 2 * time.Hour
	p := partUnder(t, opt, testPolicy)
	var off int64
	for i := range 10 {
		for _, tn := range []string{"a", "b"} {
			e := ev(fmt.Sprintf("%s%d", tn, i), t0.Add(time.Duration(i)*time.Minute), 10, 0)
			e.Tenant = tn
			p.SetClock(e.Time)
			p.Apply(e, off)
			off++
		}
	}
	var rows Rows
	p.Drain(&rows)
	p.EvictIdle()
	far := ev("far", t0.Add(365*24*time.Hour), 1, 0)
	far.Tenant = "c"
	if r := p.Apply(far, off); r != Held {
		t.Errorf("future event: %v, want Held", r)
	}
	p.Drain(&rows)
	if n := p.EvictIdle(); n != 0 {
		t.Fatalf("one future event evicted %d series", n)
	}
	if p.Evicted("a") || p.Evicted("b") {
		t.Fatal("active tenants evicted")
	}
}

// The hold is bounded: beyond HoldCapacity a future event is refused, not
// counted and not to be stored.
func TestHoldIsBounded(t *testing.T) {
	opt := DefaultOptions()
	opt.HoldCapacity = 2
	p := partUnder(t, opt, testPolicy)
	p.SetClock(t0)
	want := []Result{Held, Held, TooFarAhead}
	for i, w := range want {
		if r := p.Apply(ev(fmt.Sprintf("f%d", i), t0.Add(time.Hour), 1, 0), int64(i)); r != w {
			t.Errorf("future event %d: %v, want %v", i, r, w)
		}
	}
	// Within the bound nothing is held.
	if r := p.Apply(ev("near", t0.Add(opt.MaxFuture), 1, 0), 3); r != Accepted {
		t.Errorf("event MaxFuture ahead: %v, want Accepted", r)
	}
	if p.Stats.Refused != 1 || p.Stats.Held != 2 {
		t.Errorf("stats %+v", p.Stats)
	}
}

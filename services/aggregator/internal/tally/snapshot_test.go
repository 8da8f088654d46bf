package tally

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// snapshotTrace is rebuildTrace with a second tenant on the built-in
// policy, every event stamped with the reference clock its record would
// carry, and events stamped ahead of it (held until the clock catches up).
func snapshotTrace() (evs []*schemas.UsageEvent, clocks []time.Time) {
	for i, e := range rebuildTrace() {
		clock := t0.Add(time.Duration(i) * 7 * time.Second)
		if i%97 == 5 {
			ahead := *e
			ahead.ID, ahead.Time = fmt.Sprintf("ahead%d", i), clock.Add(10*time.Minute)
			evs, clocks = append(evs, &ahead), append(clocks, clock)
		}
		evs, clocks = append(evs, e), append(clocks, clock)
		if i%3 == 0 {
			b := *e
			b.Tenant, b.Model = "beta", []string{"claude", "gpt-4o", "o1"}[i%9/3]
			evs, clocks = append(evs, &b), append(clocks, clock)
		}
	}
	return evs, clocks
}

// TestSnapshotRoundTrip: a state loaded from a snapshot is the state it
// was taken of — its own snapshot is byte for byte the same — and, fed the
// rest of the stream (retries of ids counted before the cut and
// settlements of estimates counted before it included), answers, signals
// and drains exactly what the state that was never snapshotted does,
// whatever the cut.
func TestSnapshotRoundTrip(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	opt := DefaultOptions()
	opt.SpikeMinTokens = 1000
	evs, clocks := snapshotTrace()
	step := func(p *Partition, i int, rows *Rows) []string {
		p.SetClock(clocks[i])
		res := p.Apply(evs[i], int64(i))
		out := []string{fmt.Sprint(res)}
		for _, s := range p.TakeSignals() {
			out = append(out, fingerprint(&s))
		}
		rows.Reset()
		p.Drain(rows)
		return append(out, fmt.Sprintf("%+v", *rows))
	}
	for _, cut := range []int{1, 700, 1300, 2100, 2500, 3000, len(evs) - 1} {
		orig := New(0, opt)
		orig.SetPolicy(pol)
		var rows Rows
		for i := range cut {
			step(orig, i, &rows)
		}
		snap, err := orig.Snapshot(nil, "fp1")
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		loaded, err := Load(0, opt, pol, "fp1", snap)
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		again, err := loaded.Snapshot(nil, "fp1")
		if err != nil {
			t.Fatalf("cut %d: snapshot of the loaded state: %v", cut, err)
		}
		if !bytes.Equal(snap, again) {
			t.Fatalf("cut %d: the loaded state's snapshot differs from the one it was loaded from (%d and %d bytes)", cut, len(snap), len(again))
		}
		// Every event after the cut, duplicates and settlements of
		// estimates counted before it included.
		var lrows Rows
		n := 0
		for i := cut; i < len(evs); i++ {
			want, got := step(orig, i, &rows), step(loaded, i, &lrows)
			if fmt.Sprint(want) != fmt.Sprint(got) {
				t.Fatalf("cut %d, event %d: the loaded state answered\n%v\nthe original\n%v", cut, i, got, want)
			}
			n++
		}
	}
}

// TestSnapshotKeepsEvictedAndHeld: the evicted set, the held events and
// the overrides survive a snapshot.
func TestSnapshotKeepsEvictedAndHeld(t *testing.T) {
	pol := mustPolicy(t, testPolicy)
	p := New(0, DefaultOptions())
	p.SetPolicy(pol)
	p.SetClock(t0)
	quiet := ev("q1", t0, 10, 10)
	quiet.Tenant = "quiet"
	p.Apply(quiet, 0)
	p.Apply(ev("a1", t0.Add(3*time.Hour), 10, 10), 1)
	p.SetClock(t0.Add(3 * time.Hour))
	if p.Apply(ev("ahead", t0.Add(4*time.Hour), 10, 10), 2) != Held {
		t.Fatal("event an hour ahead not held")
	}
	p.SetOverrides("acme", []Override{{Model: "*", Quota: schemas.QuotaMonthlyTokens, Limit: 50, Until: t0.Add(48 * time.Hour)}})
	p.TakeSignals()
	p.Drain(&Rows{})
	if p.EvictIdle() == 0 || !p.Evicted("quiet") {
		t.Fatal("quiet tenant not evicted")
	}
	snap, err := p.Snapshot(nil, "fp")
	if err != nil {
		t.Fatal(err)
	}
	l, err := Load(0, DefaultOptions(), pol, "fp", snap)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Evicted("quiet") || l.Evicted("acme") {
		t.Errorf("evicted set not kept: quiet %v, acme %v", l.Evicted("quiet"), l.Evicted("acme"))
	}
	if l.Held() != 1 {
		t.Errorf("held events: %d, want 1", l.Held())
	}
	if len(l.overrides["acme"]) != 1 || l.overrides["acme"][0].Limit != 50 {
		t.Errorf("overrides not kept: %+v", l.overrides)
	}
	// The evicted tenant's remembered id survives too: restored, a retry
	// of it is a duplicate.
	if r := l.Apply(quiet, 5); r != Evicted {
		t.Errorf("event of the evicted tenant: %v, want Evicted", r)
	}
	if err := l.Restore("quiet", func(apply func(*schemas.UsageEvent, int64)) error { apply(quiet, 0); return nil }); err != nil {
		t.Fatal(err)
	}
	if r := l.Apply(quiet, 5); r != Duplicate {
		t.Errorf("retry of the evicted tenant's id after its restore: %v, want Duplicate", r)
	}
	l.SetClock(t0.Add(4 * time.Hour))
	if tok, _, _, _, _ := l.Totals("acme", "*", string(schemas.PeriodMonth)); tok != 40 {
		t.Errorf("acme monthly tokens after the held event's release: %d, want 40", tok)
	}
}

// TestSnapshotRefusedWhenMismatchedOrDamaged: a snapshot of another
// policy fingerprint, partition or version, or a damaged or truncated
// one, is refused with an error the caller can tell apart (it falls back
// to the full rebuild), never loaded wrong.
func TestSnapshotRefusedWhenMismatchedOrDamaged(t *testing.T) {
	pol := mustPolicy(t, testPolicy)
	p := New(3, DefaultOptions())
	p.SetPolicy(pol)
	for i := range 50 {
		p.Apply(ev(fmt.Sprint(i), t0.Add(time.Duration(i)*time.Second), 10, 10), int64(i))
	}
	p.TakeSignals()
	if _, err := p.Snapshot(nil, "fp"); err == nil {
		t.Fatal("snapshot taken with rows pending")
	}
	p.Drain(&Rows{})
	snap, err := p.Snapshot(nil, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(3, DefaultOptions(), pol, "fp", snap); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		id   int32
		fp   string
		data []byte
		want error
	}{
		"other fingerprint": {3, "fp2", snap, ErrSnapshotMismatch},
		"other partition":   {4, "fp", snap, ErrSnapshotMismatch},
		"truncated":         {3, "fp", snap[:len(snap)/2], ErrSnapshotCorrupt},
		"empty":             {3, "fp", nil, ErrSnapshotCorrupt},
		"flipped byte":      {3, "fp", flip(snap, len(snap)/2), ErrSnapshotCorrupt},
	} {
		if _, err := Load(c.id, DefaultOptions(), pol, c.fp, c.data); !errors.Is(err, c.want) {
			t.Errorf("%s: Load answered %v, want %v", name, err, c.want)
		}
	}
	// A policy that gives the tenant other quotas under the same
	// fingerprint (a caller's bug) is caught too.
	other := mustPolicy(t, "defaults:\n  timezone: UTC\n")
	if _, err := Load(3, DefaultOptions(), other, "fp", snap); !errors.Is(err, ErrSnapshotMismatch) {
		t.Errorf("snapshot loaded under a policy with other quotas: %v", err)
	}
}

func flip(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i] ^= 0x40
	return out
}

// TestRestartFromSnapshotEqualsFullRebuild is the restart a snapshot
// serves: the state is snapshotted at offset s, more events are counted
// and stored, the process dies at c; one restart loads the snapshot and
// replays the stored events (latest version per id, as ClickHouse holds
// them) at and above s, the other replays every stored event from
// scratch. Fed the rest of the stream, both answer, signal and drain the
// same — settlements after s of estimates counted before it included.
func TestRestartFromSnapshotEqualsFullRebuild(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	opt := DefaultOptions()
	opt.SpikeMinTokens = 1000
	evs := rebuildTrace()
	for _, cut := range [][2]int{{500, 700}, {1300, 2100}, {2050, 2990}, {2600, len(evs) - 20}} {
		s, c := cut[0], cut[1]
		live := New(0, opt)
		live.SetPolicy(pol)
		var rows Rows
		for i := range s {
			live.Apply(evs[i], int64(i))
		}
		live.TakeSignals()
		live.Drain(&rows)
		snap, err := live.Snapshot(nil, "fp")
		if err != nil {
			t.Fatal(err)
		}
		fromSnap, err := Load(0, opt, pol, "fp", snap)
		if err != nil {
			t.Fatal(err)
		}
		full := New(0, opt)
		full.SetPolicy(pol)
		fromSnap.SetReplay(true)
		full.SetReplay(true)
		for _, i := range stored(pol, opt, evs[:c]) {
			full.Apply(evs[i], int64(i))
			if i >= s {
				fromSnap.Apply(evs[i], int64(i))
			}
		}
		for _, p := range []*Partition{fromSnap, full} {
			p.SetReplay(false)
			p.ClearDirty()
		}
		var rs, rf Rows
		for i := c; i < len(evs); i++ {
			got, want := fromSnap.Apply(evs[i], int64(i)), full.Apply(evs[i], int64(i))
			rs.Reset()
			rf.Reset()
			fromSnap.Drain(&rs)
			full.Drain(&rf)
			g := fmt.Sprint(got, signalFingerprints(fromSnap.TakeSignals()), rs)
			w := fmt.Sprint(want, signalFingerprints(full.TakeSignals()), rf)
			if g != w {
				t.Fatalf("snapshot at %d, restart at %d, event %d: from the snapshot\n%s\nfull rebuild\n%s", s, c, i, g, w)
			}
		}
		for _, p := range []*Partition{fromSnap, full} {
			if tok, _, _, _, _ := p.Totals("acme", "*", string(schemas.PeriodMonth)); tok == 0 {
				t.Fatalf("snapshot at %d: no monthly tokens counted", s)
			}
		}
		ft, _, fc, _, _ := full.Totals("acme", "*", string(schemas.PeriodMonth))
		st, _, sc, _, _ := fromSnap.Totals("acme", "*", string(schemas.PeriodMonth))
		if ft != st || fc != sc {
			t.Errorf("snapshot at %d, restart at %d: monthly totals %d tokens / %g from the snapshot, %d / %g from the full rebuild", s, c, st, sc, ft, fc)
		}
	}
}

func signalFingerprints(sigs []schemas.Signal) []string {
	out := make([]string, len(sigs))
	for i := range sigs {
		out[i] = fingerprint(&sigs[i])
	}
	return out
}

// TestSnapshotCopyIsTheStateAtTheCopy: a copy taken at any cut encodes to
// exactly the snapshot of the state at that cut, whatever the state does
// afterwards — events counted, held events released, overrides set and
// lifted, tenants evicted and restored, a policy reload — and while it
// does it: the copy is encoded on another goroutine as the original moves
// on (go test -race checks that they share nothing that is written).
func TestSnapshotCopyIsTheStateAtTheCopy(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	reload := mustPolicy(t, "defaults:\n  timezone: UTC\n")
	opt := DefaultOptions()
	opt.SpikeMinTokens = 1000
	evs, clocks := snapshotTrace()
	for _, cut := range []int{1, 700, 2100, 3000} {
		orig := New(0, opt)
		orig.SetPolicy(pol)
		var rows Rows
		step := func(i int) {
			orig.SetClock(clocks[i])
			orig.Apply(evs[i], int64(i))
			orig.TakeSignals()
			rows.Reset()
			orig.Drain(&rows)
		}
		for i := range cut {
			step(i)
		}
		orig.SetOverrides("acme", []Override{{Model: "*", Quota: schemas.QuotaMonthlyTokens, Limit: 50, Until: clocks[cut].Add(48 * time.Hour)}})
		orig.TakeSignals()
		rows.Reset()
		orig.Drain(&rows)
		want, err := orig.Snapshot(nil, "fp")
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		cp, err := orig.SnapshotCopy(nil)
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		done := make(chan []byte)
		go func() {
			got, err := cp.Snapshot(nil, "fp")
			if err != nil {
				t.Errorf("cut %d: snapshot of the copy: %v", cut, err)
			}
			done <- got
		}()
		// The original moves on meanwhile.
		orig.SetOverrides("acme", nil)
		for i := cut; i < min(cut+500, len(evs)); i++ {
			step(i)
		}
		orig.SetClock(clocks[len(clocks)-1].Add(72 * time.Hour))
		orig.EvictIdle()
		orig.Reevaluate(reload)
		orig.TakeSignals()
		rows.Reset()
		orig.Drain(&rows)
		if got := <-done; !bytes.Equal(got, want) {
			t.Fatalf("cut %d: the copy's snapshot differs from the state's at the copy (%d and %d bytes)", cut, len(got), len(want))
		}
		if again, err := cp.Snapshot(nil, "fp"); err != nil || !bytes.Equal(again, want) {
			t.Fatalf("cut %d: the copy's second snapshot differs (%v)", cut, err)
		}
		if now, err := orig.Snapshot(nil, "fp"); err == nil && bytes.Equal(now, want) {
			t.Fatalf("cut %d: the state did not move after the copy; the test proves nothing", cut)
		}
	}
}

// TestSnapshotCopyRefusedWhenSnapshotIs: SnapshotCopy refuses what
// Snapshot refuses: rows or signals pending.
func TestSnapshotCopyRefusedWhenSnapshotIs(t *testing.T) {
	p := partUnder(t, DefaultOptions(), anomalyPolicy)
	evs, _ := snapshotTrace()
	p.Apply(evs[0], 0)
	if _, err := p.SnapshotCopy(nil); err == nil {
		t.Fatal("copy taken with rows pending")
	}
	if _, err := p.Snapshot(nil, "fp"); err == nil {
		t.Fatal("snapshot taken with rows pending")
	}
}

// TestSnapshotCopySharesNothing: after the copy, every map, slice and
// value of the state is overwritten in place, and the copy still encodes
// the state as it was: a tenant evicted, an event held, an override, the
// trace's quotas, windows and remembered ids.
func TestSnapshotCopySharesNothing(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	opt := DefaultOptions()
	opt.SpikeMinTokens = 1000
	p := New(0, opt)
	p.SetPolicy(pol)
	evs, clocks := snapshotTrace()
	quiet := ev("q1", clocks[0], 10, 10)
	quiet.Tenant = "quiet"
	p.SetClock(clocks[0])
	p.Apply(quiet, 0)
	for i := range 2100 {
		p.SetClock(clocks[i])
		p.Apply(evs[i], int64(i+1))
	}
	p.SetOverrides("acme", []Override{{Model: "*", Quota: schemas.QuotaMonthlyTokens, Limit: 50, Until: clocks[2100].Add(48 * time.Hour)}})
	p.TakeSignals()
	p.Drain(&Rows{})
	p.EvictIdle()
	if !p.Evicted("quiet") || p.Held() == 0 || len(p.dedup) == 0 || len(p.overrides) == 0 {
		t.Fatalf("the state lacks what the test needs: evicted %v, held %d, ids %d, overrides %d", p.Evicted("quiet"), p.Held(), len(p.dedup), len(p.overrides))
	}
	want, cp := snapshotAndCopy(t, p, nil)
	scribble(p)
	if now, _ := p.Snapshot(nil, "fp"); bytes.Equal(now, want) {
		t.Fatal("scribble changed nothing the snapshot holds; the test proves nothing")
	}
	if got, err := cp.Snapshot(nil, "fp"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy's snapshot changed with the state (%v)", err)
	}
}

// snapshotAndCopy returns p's snapshot, what a copy of p must encode to,
// and the copy, taken into into's memory (nil: new memory).
func snapshotAndCopy(t *testing.T, p *Partition, into *StateCopy) ([]byte, *StateCopy) {
	t.Helper()
	want, err := p.Snapshot(nil, "fp")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := p.SnapshotCopy(into)
	if err != nil {
		t.Fatal(err)
	}
	return want, cp
}

// scribble overwrites, in place, every piece of p's state that a shallow
// copy could share: maps, slices and what they hold.
func scribble(p *Partition) {
	for _, t := range p.tenants {
		t.wm, t.off = -7, -7
		for _, s := range t.order {
			for i := range s.quotas {
				s.quotas[i].tier, s.quotas[i].predAt, s.quotas[i].basis = 777, -7, "scribbled"
			}
			if s.win != nil {
				for i := range s.win.cells {
					s.win.cells[i].tok = -7
				}
				s.win.tok = -7
			}
			s.rate[0].tok, s.roll[0].req, s.lastMin = -7, -7, -7
		}
	}
	for k, r := range p.dedup {
		r.ts, r.cost = -7, -7
		p.dedup[k] = r
	}
	for k := range p.evicted {
		p.evicted[k] = -7
	}
	for _, ovs := range p.overrides {
		for i := range ovs {
			ovs[i].Limit = -7
		}
	}
	for i := range p.held {
		p.held[i].offset = -7
	}
	for range p.idOrder.Len() {
		k, _ := p.idOrder.Pop()
		p.idOrder.Push(k ^ 1)
	}
}

// TestSnapshotCopyReuse: a copy taken into an earlier copy's memory — of a
// larger state, then of a smaller one, after the earlier copy was encoded
// — encodes exactly the state at the new copy.
func TestSnapshotCopyReuse(t *testing.T) {
	pol := mustPolicy(t, anomalyPolicy)
	opt := DefaultOptions()
	opt.SpikeMinTokens = 1000
	evs, clocks := snapshotTrace()
	build := func(n int) *Partition {
		p := New(0, opt)
		p.SetPolicy(pol)
		var rows Rows
		for i := range n {
			p.SetClock(clocks[i])
			p.Apply(evs[i], int64(i))
			p.TakeSignals()
			rows.Reset()
			p.Drain(&rows)
		}
		return p
	}
	var spare *StateCopy
	for _, n := range []int{300, 3000, 50, 2000} {
		p := build(n)
		want, c := snapshotAndCopy(t, p, spare)
		if spare != nil && c != spare {
			t.Fatal("the copy was not taken into the memory given")
		}
		got, err := c.Snapshot(nil, "fp")
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%d events: the reused copy's snapshot differs from the state's (%v)", n, err)
		}
		spare = c
	}
}

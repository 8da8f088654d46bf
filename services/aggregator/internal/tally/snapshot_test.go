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

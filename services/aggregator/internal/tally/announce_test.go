package tally

import (
	"testing"

	"github.com/sluicehq/sluice/schemas"
)

// rebuilt is acme's partition rebuilt in replay mode (no signals) under an
// hourly limit of limit, after 1,100 tokens.
func rebuilt(t *testing.T, limit int) *Partition {
	t.Helper()
	p := partUnder(t, DefaultOptions(), hourlyPolicy(limit))
	p.SetReplay(true)
	p.Apply(ev("a1", t0, 1100, 0), 1)
	p.SetReplay(false)
	p.ClearDirty()
	p.TakeSignals()
	return p
}

// TestAnnounceRestoredSaysWhatWasNotAnnounced: a state rebuilt under a
// limit lowered while no aggregator ran is at 100% with no crossing; it
// announces the tier and the exhaustion the previous owner never did
// (which the enforcer blocks on), nothing when that is what was announced
// or the limit is the one it was announced under, and a tier down when
// the limit was raised meanwhile.
func TestAnnounceRestoredSaysWhatWasNotAnnounced(t *testing.T) {
	hourly := func(tier int, exhausted bool, limit float64) map[AnnouncedKey]Announced {
		return map[AnnouncedKey]Announced{{"acme", "*", string(schemas.QuotaHourlyTokens), t0.Unix()}: {tier, exhausted, limit}}
	}
	p := rebuilt(t, 1000)
	if n := p.AnnounceRestored("", hourly(70, false, 2000), 7); n != 2 {
		t.Fatalf("%d signals announced for a tier 100 announced as 0, want 2: %+v", n, p.PendingSignals())
	}
	sigs := p.TakeSignals()
	up := tierSignals(sigs, schemas.QuotaHourlyTokens)
	ex := kinds(sigs, schemas.SignalQuotaExhausted)
	if len(up) != 1 || up[0].Tier != 100 || up[0].PreviousTier != 70 || up[0].Direction != schemas.DirectionUp || up[0].Source.FromOffset != 7 {
		t.Fatalf("want tier_crossed 70 -> 100 at offset 7, got %+v", sigs)
	}
	if len(ex) != 1 || ex[0].Tenant != "acme" || ex[0].Limit != 1000 || ex[0].Used != 1100 {
		t.Fatalf("want acme's hourly quota_exhausted, got %+v", sigs)
	}
	for _, s := range sigs {
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	if row := hourlyRow(t, p); row.Tier != 100 {
		t.Fatalf("quota_state row tier %d after the announcement, want 100", row.Tier)
	}
	// The same restore again announces under the same ids.
	again := rebuilt(t, 1000)
	again.AnnounceRestored("", hourly(70, false, 2000), 7)
	for i, s := range again.TakeSignals() {
		if s.ID != sigs[i].ID {
			t.Fatalf("signal %d: id %q on the second restore, %q on the first", i, s.ID, sigs[i].ID)
		}
	}

	if n := rebuilt(t, 1000).AnnounceRestored("", nil, 7); n != 2 {
		t.Fatalf("%d signals for a period nothing was announced for, want 2", n)
	}
	if n := rebuilt(t, 1000).AnnounceRestored("", hourly(100, true, 1000), 7); n != 0 {
		t.Fatalf("%d signals when the restored state is what was announced", n)
	}
	// Under the limit it was announced under, a replay's different tier
	// (it never saw the estimates the live run did) is no news.
	if n := rebuilt(t, 1000).AnnounceRestored("", hourly(90, false, 1000), 7); n != 0 {
		t.Fatalf("%d signals under the limit the previous owner announced with", n)
	}
	raised := rebuilt(t, 10000)
	raised.AnnounceRestored("", hourly(100, true, 1000), 7)
	down := tierSignals(raised.TakeSignals(), schemas.QuotaHourlyTokens)
	if len(down) != 1 || down[0].Tier != 0 || down[0].Direction != schemas.DirectionDown {
		t.Fatalf("want tier_crossed 100 -> 0 after a raised limit, got %+v", down)
	}
}

package tally

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// An operator override of the hourly limit acts like a policy change, at
// once; lifting it and its expiry re-evaluate too; a 0 limit blocks.
func TestOverrideReevaluatesAtOnce(t *testing.T) {
	p := blockedTenant(t)
	p.SetClock(t0)
	until := t0.Add(30 * time.Minute)
	p.SetOverrides("acme", []Override{{Model: "*", Quota: schemas.QuotaHourlyTokens, Limit: 10000, Until: until}})
	down := tierSignals(p.TakeSignals(), schemas.QuotaHourlyTokens)
	if len(down) != 1 || down[0].Direction != schemas.DirectionDown || down[0].Tier != 0 || down[0].Limit != 10000 {
		t.Fatalf("override: want tier down at limit 10000, got %+v", down)
	}
	if r := hourlyRow(t, p); r.Limit != 10000 || r.Tier != 0 {
		t.Errorf("quota_state under the override = %+v", r)
	}
	// Expiry on the reference clock: back to the policy's 1000, tier 100.
	p.SetClock(until)
	up := tierSignals(p.TakeSignals(), schemas.QuotaHourlyTokens)
	if len(up) != 1 || up[0].Direction != schemas.DirectionUp || up[0].Tier != 100 || up[0].Limit != 1000 {
		t.Fatalf("expiry: want tier back up to 100 at limit 1000, got %+v", up)
	}
	// An override of 0 on a quota the tenant does not have blocks at once.
	p.SetOverrides("acme", []Override{{Model: "*", Quota: schemas.QuotaDailyTokens, Limit: 0, Until: until.Add(time.Hour)}})
	sigs := p.TakeSignals()
	blk := tierSignals(sigs, schemas.QuotaDailyTokens)
	if len(blk) != 1 || blk[0].Tier != 100 || len(kinds(sigs, schemas.SignalQuotaExhausted)) != 1 {
		t.Fatalf("zero override: want daily tier 100 and exhausted, got %+v", sigs)
	}
	for _, s := range sigs {
		if err := s.Validate(); err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
	}
	// Lifted (a tombstone): the daily quota goes away, its tier down.
	p.SetOverrides("acme", nil)
	if d := tierSignals(p.TakeSignals(), schemas.QuotaDailyTokens); len(d) != 1 || d[0].Direction != schemas.DirectionDown {
		t.Fatalf("lift: want daily tier down, got %+v", d)
	}
}

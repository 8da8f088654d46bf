package tally

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

func hourlyPolicy(limit int) string {
	return fmt.Sprintf(`
tenants:
  acme:
    models:
      "*": {hourly_tokens: %d}
  other:
    models:
      "*": {hourly_tokens: 1000}
`, limit)
}

// blockedTenant returns a partition whose tenant acme used 100% of its
// hourly quota (1000 tokens) and tenant other 50% of its own.
func blockedTenant(t *testing.T) *Partition {
	t.Helper()
	p := partUnder(t, DefaultOptions(), hourlyPolicy(1000))
	p.Apply(ev("a1", t0, 1000, 0), 1)
	o := ev("o1", t0, 500, 0)
	o.Tenant = "other"
	p.Apply(o, 2)
	sigs := p.TakeSignals()
	if len(kinds(sigs, schemas.SignalQuotaExhausted)) != 1 {
		t.Fatalf("setup: want acme's hourly exhausted, got %+v", sigs)
	}
	var rows Rows
	p.Drain(&rows)
	return p
}

func tierSignals(sigs []schemas.Signal, quota schemas.QuotaKind) []schemas.Signal {
	var out []schemas.Signal
	for _, s := range kinds(sigs, schemas.SignalTierCrossed) {
		if s.Quota == quota && s.Model == "*" {
			out = append(out, s)
		}
	}
	return out
}

func hourlyRow(t *testing.T, p *Partition) QuotaRow {
	t.Helper()
	var rows Rows
	p.Drain(&rows)
	for _, r := range rows.Quotas {
		if r.Tenant == "acme" && r.Model == "*" && r.Quota == string(schemas.QuotaHourlyTokens) && r.PeriodStart.Equal(t0) {
			return r
		}
	}
	t.Fatalf("no hourly quota_state row for acme/* drained: %+v", rows.Quotas)
	return QuotaRow{}
}

// A raised limit takes a blocked tenant's tier down at once, with no new
// event from it (a refused tenant sends none); tenants whose policy did not
// change emit nothing.
func TestPolicyChangeReevaluatesBlockedTenantAtOnce(t *testing.T) {
	p := blockedTenant(t)
	p.Reevaluate(mustPolicy(t, hourlyPolicy(10000)))
	if !p.Pending() {
		t.Fatal("a re-evaluation that changed tiers must leave something to flush")
	}
	sigs := p.TakeSignals()
	down := tierSignals(sigs, schemas.QuotaHourlyTokens)
	if len(down) != 1 || down[0].Direction != schemas.DirectionDown || down[0].Tier != 0 || down[0].PreviousTier != 100 || down[0].Tenant != "acme" || down[0].Limit != 10000 {
		t.Fatalf("want one tier_crossed down 100 -> 0 for acme at the new limit, got %+v", sigs)
	}
	if err := down[0].Validate(); err != nil {
		t.Fatal(err)
	}
	if r := hourlyRow(t, p); r.Limit != 10000 || r.Tier != 0 || r.Used != 1000 {
		t.Errorf("quota_state row = %+v, want limit 10000, tier 0, used 1000", r)
	}
	// Using up the new limit exhausts it again, under a new signal id.
	p.Apply(ev("a2", t0.Add(time.Minute), 9000, 0), 3)
	ex := kinds(p.TakeSignals(), schemas.SignalQuotaExhausted)
	if len(ex) != 1 {
		t.Fatalf("second exhaustion: %+v", ex)
	}
}

// A quota the new policy drops takes its tier down too.
func TestPolicyDroppingAQuotaTakesItsTierDown(t *testing.T) {
	p := blockedTenant(t)
	p.Reevaluate(mustPolicy(t, "tenants:\n  acme:\n    models:\n      \"*\": {monthly_tokens: 1000000}\n  other:\n    models:\n      \"*\": {hourly_tokens: 1000}\n"))
	down := tierSignals(p.TakeSignals(), schemas.QuotaHourlyTokens)
	if len(down) != 1 || down[0].Direction != schemas.DirectionDown || down[0].Tier != 0 {
		t.Fatalf("want the dropped hourly quota's tier down, got %+v", down)
	}
	if err := down[0].Validate(); err != nil {
		t.Fatal(err)
	}
}

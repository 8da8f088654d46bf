package tally

import (
	"time"

	"testing"

	"github.com/sluicehq/sluice/schemas"
)

const unpricedPolicy = `
price_catalog: none
unpriced_price: {currency: USD, prompt: 10, completion: 20, cached: 10}
tenants:
  solo: {}
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 1, completion: 2}
`

// TestUnpricedModelAlertsOncePerModelAndCountsAtFallback: the first event
// of a model without a price raises one unpriced-model anomaly signal (a
// valid one, which the enforcer does not act on); further events of it,
// from any tenant, raise none; a priced model raises none; and the
// unpriced usage costs the policy's unpriced_price, not 0.
func TestUnpricedModelAlertsOncePerModelAndCountsAtFallback(t *testing.T) {
	p := partUnder(t, DefaultOptions(), unpricedPolicy)
	var sigs []schemas.Signal
	for i, c := range []struct{ tenant, model string }{
		{"acme", "gpt-4o"}, {"acme", "mystery"}, {"acme", "mystery"}, {"beta", "mystery"}, {"beta", "other-new"},
	} {
		e := ev(string(rune('a'+i)), t0.Add(time.Duration(i)*time.Second), 1000, 1000)
		e.Tenant, e.Model = c.tenant, c.model
		p.Apply(e, int64(i+1))
		sigs = append(sigs, p.TakeSignals()...)
	}
	var alerted []string
	for _, s := range kinds(sigs, schemas.SignalAnomaly) {
		if s.Attributes["detector"] != DetectorUnpriced {
			continue
		}
		if err := s.Validate(); err != nil {
			t.Errorf("invalid signal %+v: %v", s, err)
		}
		alerted = append(alerted, s.Tenant+"/"+s.Model)
	}
	if len(alerted) != 2 || alerted[0] != "acme/mystery" || alerted[1] != "beta/other-new" {
		t.Errorf("unpriced alerts %v, want [acme/mystery beta/other-new]", alerted)
	}
	if p.Stats.Unpriced != 4 {
		t.Errorf("Stats.Unpriced = %d, want 4", p.Stats.Unpriced)
	}
	// 2 events of 1000+1000 tokens at 10/20 per million.
	if _, _, cost, _, _ := p.Totals("acme", "mystery", "day"); cost != 0.06 {
		t.Errorf("acme/mystery cost %v, want 0.06 at the unpriced_price", cost)
	}
}

// TestUnpricedModelAlertsOnlyWhereMoneyIsCounted: a tenant without a
// budget under a policy without unpriced_price meters tokens only, and
// is not alerted about prices.
func TestUnpricedModelAlertsOnlyWhereMoneyIsCounted(t *testing.T) {
	p := partUnder(t, DefaultOptions(), "price_catalog: none\ntenants:\n  rich: {budget: {amount: 5, currency: USD}}\n")
	var alerted []string
	for i, tenant := range []string{"acme", "rich"} {
		e := ev(tenant, t0.Add(time.Duration(i)*time.Second), 10, 10)
		e.Tenant = tenant
		p.Apply(e, int64(i+1))
		for _, s := range p.TakeSignals() {
			if s.Attributes["detector"] == DetectorUnpriced {
				alerted = append(alerted, s.Tenant)
			}
		}
	}
	if len(alerted) != 1 || alerted[0] != "rich" {
		t.Errorf("unpriced alerts for %v, want [rich] (the tenant with a budget)", alerted)
	}
}

package tally

import (
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// DetectorUnpriced is the detector (and type) attribute of the anomaly
// signal raised the first time a partition counts a model without a price:
// the alerter turns it into an alert (rule anomaly, variant
// unpriced_model) through the signal path every other alert takes, and
// the enforcer, which only acts on error_ratio and slow_call anomalies,
// ignores it.
const DetectorUnpriced = "unpriced_model"

// maxUnpricedModels bounds the models a partition remembers having
// alerted for. When full, a further unpriced model is still counted (at
// unpriced_price, in Stats.Unpriced and the reports' unpriced lines) but
// raises no alert of its own: the alerts already raised say the catalog
// needs attention, and made-up model names must not grow memory.
const maxUnpricedModels = 10000

// unpricedEvent counts an event no price covers and raises the
// unpriced-model alert once per model: the first tenant seen using it
// names it. Only where money is counted: for a tenant with a budget, or
// under a policy that sets unpriced_price; a deployment that meters
// tokens only is not alerted about prices it never asked for. A replay after a restart marks the models it meets without
// alerting again (they were alerted before the restart); a restarted
// partition that meets an unpriced model anew alerts once more.
func (p *Partition) unpricedEvent(t *tenant, ev *schemas.UsageEvent, offset int64) {
	p.Stats.Unpriced++
	if _, seen := p.unpriced[ev.Model]; seen {
		return
	}
	if _, fallback := p.pol.UnpricedPrice(); !fallback && t.tp.Budget == nil {
		return
	}
	if p.unpriced == nil {
		p.unpriced = map[string]struct{}{}
	}
	if len(p.unpriced) >= maxUnpricedModels {
		return
	}
	p.unpriced[ev.Model] = struct{}{}
	at := ev.Time.UTC()
	p.emit(schemas.Signal{
		ID:          schemas.SignalID(string(schemas.SignalAnomaly), DetectorUnpriced, ev.Model),
		Kind:        schemas.SignalAnomaly,
		Time:        at,
		Tenant:      t.id,
		Model:       ev.Model,
		PeriodStart: at,
		PeriodEnd:   at.Add(time.Second),
		Reason: "model " + ev.Model + " has no price (first seen for tenant " + t.id + "); its usage is counted at the policy's " +
			"unpriced_price and reported as unpriced until it is priced in the catalog, prices_file or the policy's prices",
		Source: schemas.SignalSource{FromOffset: offset, ToOffset: offset},
		Attributes: map[string]string{
			"detector": DetectorUnpriced,
			"type":     DetectorUnpriced,
			"state":    "firing",
		},
	})
}

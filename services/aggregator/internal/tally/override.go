package tally

import (
	"math"
	"sort"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// Operator overrides.
//
// An override (schemas.AdminState of kind override, from sluice.admin.v1)
// replaces one quota's limit for a tenant × model ("*" for the
// tenant-wide series) until it expires; Limit 0 blocks at once. The
// enforcer applies it to flags; the state applies it to tiers, so that the
// signals, quota_state and alerts agree with the flags: an override that
// lifts a block takes the tier down (and resolves the alert) at once, and
// one that lowers a limit raises it. Setting, lifting and expiry each
// re-evaluate the tenant at once, like a policy change. Expiry is measured
// on the reference clock (SetClock).

// Override is one active quota override of a tenant.
type Override struct {
	Model string
	Quota schemas.QuotaKind
	Limit float64
	Until time.Time
}

// SetOverrides replaces tenant's overrides with ovs (none: lifted) and
// re-evaluates the tenant at once if it is in memory. Overrides past their
// Until on the reference clock are ignored.
func (p *Partition) SetOverrides(tenant string, ovs []Override) {
	var keep []Override
	for _, o := range ovs {
		if o.Limit >= 0 && !math.IsNaN(o.Limit) && (p.now == 0 || o.Until.Unix() > p.now) {
			keep = append(keep, o)
		}
	}
	if len(keep) == 0 && len(p.overrides[tenant]) == 0 {
		return
	}
	if len(keep) == 0 {
		delete(p.overrides, tenant)
	} else {
		if p.overrides == nil {
			p.overrides = map[string][]Override{}
		}
		p.overrides[tenant] = keep
	}
	p.nextExpiry()
	if t, ok := p.tenants[tenant]; ok {
		p.reevaluate(t)
	}
}

// nextExpiry recomputes the earliest Until among the overrides.
func (p *Partition) nextExpiry() {
	p.ovNext = 0
	for _, list := range p.overrides {
		for _, o := range list {
			if u := o.Until.Unix(); p.ovNext == 0 || u < p.ovNext {
				p.ovNext = u
			}
		}
	}
}

// expireOverrides drops the overrides whose Until the reference clock
// reached and re-evaluates their tenants.
func (p *Partition) expireOverrides() {
	if p.ovNext == 0 || p.now < p.ovNext {
		return
	}
	var tenants []string
	for tn, list := range p.overrides {
		keep := list[:0]
		for _, o := range list {
			if o.Until.Unix() > p.now {
				keep = append(keep, o)
			}
		}
		if len(keep) != len(list) {
			tenants = append(tenants, tn)
		}
		if len(keep) == 0 {
			delete(p.overrides, tn)
		} else {
			p.overrides[tn] = keep
		}
	}
	p.nextExpiry()
	sort.Strings(tenants)
	for _, tn := range tenants {
		if t, ok := p.tenants[tn]; ok {
			p.reevaluate(t)
		}
	}
}

// quotas returns the quotas of t × model: the policy's, with the tenant's
// active overrides replacing (or adding) limits.
func (p *Partition) quotas(t *tenant, model string) []quotaSpec {
	qs := t.tp.Quotas(model)
	out := make([]quotaSpec, 0, len(qs))
	for _, q := range qs {
		out = append(out, quotaSpec{q: q})
	}
	for _, o := range p.overrides[t.id] {
		if o.Model != model {
			continue
		}
		i := 0
		for i < len(out) && out[i].q.Name != o.Quota {
			i++
		}
		if i == len(out) {
			if !o.Quota.Valid() {
				continue
			}
			out = append(out, quotaSpec{q: policy.Quota{Name: o.Quota, Period: o.Quota.Period(), Unit: o.Quota.Unit(), Mode: t.tp.ModeFor(model)}})
		}
		out[i].q.Limit, out[i].override = o.Limit, true
	}
	return out
}

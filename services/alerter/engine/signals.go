package engine

import (
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// This file maps signals to alerts: which rule and key a signal of each
// kind concerns, and the level of its condition (see state.level).

// apply maps one new signal onto the alerts it concerns.
func (e *Engine) apply(sig *schemas.Signal, now time.Time) {
	base := alert.Key{Tenant: sig.Tenant, Model: sig.Model, Period: string(sig.Period), Quota: string(sig.Quota)}
	// A replay after a restart rebuilds state from old signals; these two
	// rules keep old news from firing. A quota signal about a period that
	// has ended is over, and a one-off signal older than AutoResolveAfter
	// would have auto-resolved already.
	periodOver := !sig.PeriodEnd.IsZero() && !now.Before(sig.PeriodEnd)
	stale := now.Sub(sig.Time) >= e.cfg.AutoResolveAfter
	switch sig.Kind {
	case schemas.SignalTierCrossed, schemas.SignalQuotaExhausted, schemas.SignalExhaustionPredicted:
		if periodOver {
			for _, r := range []alert.Rule{alert.RuleQuotaTier, alert.RuleExhaustionPredicted} {
				if st := e.alerts[withRule(base, r, "")]; st != nil {
					e.clear(st.cur.Key, st, now)
				}
			}
			return
		}
	case schemas.SignalRateExceeded, schemas.SignalAnomaly, schemas.SignalReconciliationDrift:
		if stale {
			return
		}
	}
	switch sig.Kind {
	case schemas.SignalTierCrossed:
		e.observe(withRule(base, alert.RuleQuotaTier, ""), sig.Tier, sig, now)
	case schemas.SignalQuotaExhausted:
		e.observe(withRule(base, alert.RuleQuotaTier, ""), max(sig.Tier, 100), sig, now)
		// Exhausted is past predicting.
		e.observe(withRule(base, alert.RuleExhaustionPredicted, ""), 0, sig, now)
	case schemas.SignalExhaustionPredicted:
		level := e.exhaustionLevel(sig)
		if clearing(sig.Attributes[schemas.AttrState]) {
			level = 0 // the aggregator no longer predicts it within its horizon
		}
		e.observe(withRule(base, alert.RuleExhaustionPredicted, ""), level, sig, now)
	case schemas.SignalPeriodReset:
		// A new period: every quota condition of the old one is over.
		for k, st := range e.alerts {
			if k.Tenant == base.Tenant && k.Model == base.Model && k.Quota == base.Quota &&
				(k.Rule == alert.RuleQuotaTier || k.Rule == alert.RuleExhaustionPredicted || k.Rule == alert.RuleRateExceeded) {
				e.clear(k, st, now)
			}
		}
	case schemas.SignalRateExceeded:
		level := levelOf(alert.SeverityWarning)
		if sig.Limit > 0 && sig.Used < sig.Limit {
			level = 0
		}
		e.observe(withRule(base, alert.RuleRateExceeded, ""), level, sig, now)
	case schemas.SignalAnomaly:
		level := levelOf(alert.SeverityWarning)
		if clearing(sig.Attributes["state"]) {
			level = 0
		}
		if b := sig.Attributes["breaker"]; b != "" {
			if level > 0 {
				level = levelOf(alert.SeverityCritical)
			}
			e.observe(withRule(base, alert.RuleBreakerOpen, b), level, sig, now)
			return
		}
		variant := sig.Attributes["type"]
		if variant == "" {
			variant = "anomaly"
		}
		e.observe(withRule(base, alert.RuleAnomaly, variant), level, sig, now)
	case schemas.SignalReconciliationDrift:
		level := levelOf(alert.SeverityWarning)
		if clearing(sig.Attributes["state"]) {
			level = 0
		}
		e.observe(withRule(base, alert.RuleReconciliationDrift, ""), level, sig, now)
	}
}

// exhaustionLevel is the level of an exhaustion prediction: clear beyond
// the warning horizon, otherwise the severity policy.ExhaustionSeverity
// gives the time left against the critical horizon.
func (e *Engine) exhaustionLevel(sig *schemas.Signal) int {
	if sig.PredictedExhaustion == nil {
		return 0
	}
	lead := sig.PredictedExhaustion.Sub(sig.Time)
	if lead > e.cfg.ExhaustionWarning {
		return 0
	}
	return levelOf(policy.ExhaustionSeverity(lead.Seconds(), e.cfg.ExhaustionCritical.Seconds()))
}

// clearing reports whether an anomaly or drift signal's state attribute says
// the condition ended.
func clearing(s string) bool {
	return s == "resolved" || s == "closed" || s == "clear" || s == "ok"
}

// withRule is the key of rule r (and variant) for the quota key k.
func withRule(k alert.Key, r alert.Rule, variant string) alert.Key {
	k.Rule = r
	k.Variant = variant
	if r == alert.RuleAnomaly || r == alert.RuleBreakerOpen {
		// Anomalies are not tied to a quota's period.
		k.Quota = ""
	}
	return k
}

// Package alert defines what the alerter's state machine hands its
// notification channels: alerts identified by tenant × model × period × rule,
// their severity and status, and the messages that carry one alert or a
// grouped incident of many.
package alert

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Rule names the condition an alert watches. Together with tenant, model and
// quota it is the dedup key: one alert per key at any time.
type Rule string

// The rules the alerter evaluates.
const (
	// RuleQuotaTier: usage crossed one of the tenant's alert tiers (70, 90,
	// 100 … percent of a quota). One alert per quota carries the highest tier
	// reached; a higher tier escalates it, a lower one never re-notifies.
	RuleQuotaTier Rule = "quota_tier"
	// RuleExhaustionPredicted: at the current rate the quota runs out within
	// the warning horizon (critical within the shorter critical horizon).
	RuleExhaustionPredicted Rule = "exhaustion_predicted"
	// RuleRateExceeded: a tokens- or requests-per-minute window went over
	// its limit.
	RuleRateExceeded Rule = "rate_exceeded"
	// RuleBreakerOpen: a breaker opened (an anomaly signal carrying the
	// attribute breaker=<kind>).
	RuleBreakerOpen Rule = "breaker_open"
	// RuleAnomaly: a rate spike, error ratio or slow-call ratio out of the
	// ordinary.
	RuleAnomaly Rule = "anomaly"
	// RuleReconciliationDrift: the reconciler found counters and raw events
	// disagreeing.
	RuleReconciliationDrift Rule = "reconciliation_drift"
)

// AlertName returns the Alertmanager alertname label for r.
func (r Rule) AlertName() string {
	switch r {
	case RuleQuotaTier:
		return "SluiceQuotaTier"
	case RuleExhaustionPredicted:
		return "SluiceQuotaExhaustionPredicted"
	case RuleRateExceeded:
		return "SluiceRateExceeded"
	case RuleBreakerOpen:
		return "SluiceBreakerOpen"
	case RuleAnomaly:
		return "SluiceAnomaly"
	case RuleReconciliationDrift:
		return "SluiceReconciliationDrift"
	}
	return "Sluice_" + string(r)
}

// Severity orders how urgently an alert needs a human; the rules that map
// tiers and exhaustion horizons to it live in the policy package.
type Severity = policy.Severity

// The severities, lowest first.
const (
	SeverityInfo     = policy.SeverityInfo
	SeverityWarning  = policy.SeverityWarning
	SeverityCritical = policy.SeverityCritical
)

// Status says whether a notification announces a problem or its end.
type Status string

// The statuses of a notification.
const (
	StatusFiring   Status = "firing"
	StatusResolved Status = "resolved"
)

// Key identifies one alert: the dedup unit of the alerter.
type Key struct {
	Tenant string
	Model  string
	// Period is the quota's period (month, day, hour, minute) or empty for
	// rules not tied to a quota.
	Period string
	// Quota names the quota (monthly_tokens …) so that two quotas with the
	// same period, tokens and budget for example, do not share an alert.
	Quota string
	Rule  Rule
	// Variant separates alerts of one rule that are different problems, for
	// example the anomaly type or the breaker kind.
	Variant string
}

// String renders k for logs and as a stable map key.
func (k Key) String() string {
	return strings.Join([]string{k.Tenant, k.Model, k.Period, k.Quota, string(k.Rule), k.Variant}, "|")
}

// Alert is one alert's state as a channel renders it.
type Alert struct {
	Key      Key
	Status   Status
	Severity Severity
	// Tier is the quota tier in percent for RuleQuotaTier, else 0.
	Tier int
	// Used, Limit and Rate come from the latest signal, in Unit (Rate per
	// minute).
	Used, Limit, Rate float64
	Unit              string
	Mode              string
	// PredictedExhaustion is when the quota runs out at Rate, if known.
	PredictedExhaustion *time.Time
	// PeriodEnd is when the quota's counting period ends, if known.
	PeriodEnd time.Time
	// Reason is the signal's human explanation.
	Reason string
	// StartsAt is when the alert began firing; EndsAt when it resolved
	// (zero while firing).
	StartsAt, EndsAt time.Time
	// Language is the tenant's message language, "en" or "zh".
	Language string
	// Attributes carries the signal's extra figures.
	Attributes map[string]string
}

// Percent returns Used as a percentage of Limit, or 0 without a limit.
func (a *Alert) Percent() float64 {
	if a.Limit <= 0 {
		return 0
	}
	return a.Used / a.Limit * 100
}

// Labels returns the Alertmanager label set that identifies a.
func (a *Alert) Labels() map[string]string {
	l := map[string]string{
		"alertname": a.Key.Rule.AlertName(),
		"tenant":    a.Key.Tenant,
		"model":     a.Key.Model,
		"severity":  a.Severity.String(),
		"source":    "sluice",
	}
	if a.Key.Period != "" {
		l["period"] = a.Key.Period
	}
	if a.Key.Quota != "" {
		l["quota"] = a.Key.Quota
	}
	if a.Key.Rule == RuleQuotaTier {
		l["tier"] = strconv.Itoa(a.Tier)
	}
	if a.Key.Variant != "" {
		l["variant"] = a.Key.Variant
	}
	return l
}

// Message is what one channel delivers at once: a single alert, or an
// incident grouping many alerts of the same rule and status when a global
// problem trips many tenants within one grouping window.
type Message struct {
	Alerts []Alert
	// Superseded holds alerts that this message replaces in a channel that
	// identifies alerts by labels (Alertmanager): an escalation from tier 70
	// to 90 changes the tier and severity labels, so the old label set is
	// resolved there. Direct channels ignore it.
	Superseded []Alert
	// Resend marks Alertmanager's periodic re-send of firing alerts, which
	// direct channels never receive.
	Resend bool
}

// Incident reports whether m groups more than one alert.
func (m *Message) Incident() bool { return len(m.Alerts) > 1 }

// Status returns the status of m's alerts (all share one).
func (m *Message) Status() Status {
	if len(m.Alerts) == 0 {
		return StatusFiring
	}
	return m.Alerts[0].Status
}

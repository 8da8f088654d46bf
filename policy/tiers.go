package policy

import "math"

// This file is the one home of the alert-tier rules: the default tiers, the
// tier a usage has reached (with and without hysteresis) and the severity a
// tier or an exhaustion horizon carries. The aggregator, the reconciler's
// repair and the alerter all call these; none keeps its own copy.

// DefaultAlertTiers returns the tiers a tenant gets when the policy names
// none: 70, 90 and 100 percent of each quota.
func DefaultAlertTiers() []int { return []int{70, 90, 100} }

// Percent is used as a percentage of limit; 0 when there is no limit.
func Percent(used, limit float64) float64 {
	if limit <= 0 {
		return 0
	}
	return used / limit * 100
}

// TierReached is the highest tier in tiers that pct has reached, or 0.
func TierReached(tiers []int, pct float64) int {
	out := 0
	for _, t := range tiers {
		if pct >= float64(t) && t > out {
			out = t
		}
	}
	return out
}

// NextTier is the tier for usage pct given the current tier cur: up as soon
// as a threshold is reached, down only once pct is more than hysteresis
// points below cur, so usage hovering at a threshold does not flap.
func NextTier(tiers []int, pct float64, cur int, hysteresis float64) int {
	up := TierReached(tiers, pct)
	if up >= cur || pct >= float64(cur)-hysteresis {
		return max(up, cur)
	}
	return up
}

// Severity orders how urgently a quota condition needs a human. Its String
// is the Alertmanager `severity` label.
type Severity int

// The severities, lowest first.
const (
	SeverityInfo Severity = iota
	SeverityWarning
	SeverityCritical
)

// String returns the severity's label value: info, warning or critical.
func (s Severity) String() string {
	switch s {
	case SeverityWarning:
		return "warning"
	case SeverityCritical:
		return "critical"
	}
	return "info"
}

// ParseSeverity parses info, warning or critical.
func ParseSeverity(s string) (Severity, bool) {
	for _, v := range []Severity{SeverityInfo, SeverityWarning, SeverityCritical} {
		if v.String() == s {
			return v, true
		}
	}
	return 0, false
}

// Tier thresholds of the severities: a tier at or above CriticalTier is
// critical (the quota is gone), at or above WarningTier a warning.
const (
	WarningTier  = 90
	CriticalTier = 100
)

// TierSeverity is the severity of reaching tier.
func TierSeverity(tier int) Severity {
	switch {
	case tier >= CriticalTier:
		return SeverityCritical
	case tier >= WarningTier:
		return SeverityWarning
	}
	return SeverityInfo
}

// ExhaustionSeverity is the severity of a quota predicted to run out in
// secondsLeft: critical within criticalHorizon seconds, warning otherwise
// (the caller raises a prediction only inside its warning horizon).
func ExhaustionSeverity(secondsLeft, criticalHorizon float64) Severity {
	if !math.IsNaN(secondsLeft) && secondsLeft <= criticalHorizon {
		return SeverityCritical
	}
	return SeverityWarning
}

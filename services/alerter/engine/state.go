package engine

import (
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// This file is the state machine of one alert: pending while its condition
// has held less than PendingFor, firing once notified, escalated when a
// higher level holds PendingFor, resolved when the condition stayed clear
// ResolveAfter (or, for rules without a "clear" signal, when no signal
// refreshed it for AutoResolveAfter).

// state is one key's alert.
type state struct {
	cur alert.Alert
	// level is the condition's strength now: the tier for quota_tier, 1
	// (warning) or 2 (critical) for the others; 0 means clear.
	level int
	// since is when the condition last went from clear to held; levelSince
	// when level last changed to its current value.
	since, levelSince time.Time
	// clearSince is when a firing alert's condition cleared.
	clearSince time.Time
	// lastSeen is the last signal that held the condition, for auto-resolve.
	lastSeen time.Time
	firing   bool
	// firedLevel is the level last notified (or due to be, if suppressed).
	firedLevel int
	// delivered says a firing notification went out; an alert never
	// delivered is never resolved aloud.
	delivered bool
	// owed says a firing notification (the first, or an escalation) waits
	// on a silence or quiet hours.
	owed bool
	// sent is the alert as last delivered, whose label set an escalation
	// supersedes in Alertmanager.
	sent alert.Alert
	// id is the key as a string, the delivery order within a tick.
	id string
}

func (e *Engine) observe(k alert.Key, level int, sig *schemas.Signal, now time.Time) {
	st := e.alerts[k]
	if level <= 0 {
		if st != nil {
			e.markDirty(k)
			e.update(st, sig)
			e.clear(k, st, now)
		}
		return
	}
	if st == nil {
		if len(e.alerts) >= e.cfg.MaxAlerts {
			e.stats.DroppedNewAlerts++
			return
		}
		st = &state{cur: alert.Alert{Key: k}, id: k.String()}
		e.alerts[k] = st
	}
	e.markDirty(k)
	e.update(st, sig)
	if st.level == 0 {
		if !st.firing {
			st.since = now
		}
		st.clearSince = time.Time{}
	}
	if level != st.level {
		st.levelSince = now
	}
	st.level = level
	st.lastSeen = now
}

// update copies the signal's figures into the alert.
func (e *Engine) update(st *state, sig *schemas.Signal) {
	a := &st.cur
	a.Used, a.Limit, a.Rate = sig.Used, sig.Limit, sig.Rate
	a.Unit, a.Mode, a.Reason = string(sig.Unit), string(sig.Mode), sig.Reason
	a.PeriodEnd = sig.PeriodEnd
	a.Attributes = sig.Attributes
	if sig.PredictedExhaustion != nil {
		t := *sig.PredictedExhaustion
		a.PredictedExhaustion = &t
	}
}

func (e *Engine) clear(k alert.Key, st *state, now time.Time) {
	e.markDirty(k)
	if !st.firing {
		// A pending alert that clears was never news.
		delete(e.alerts, k)
		return
	}
	if st.level > 0 {
		st.level = 0
		st.clearSince = now
	}
}

// severity maps a key's level to a severity: a quota_tier alert's level is
// its tier, the other rules' levels are levelOf a severity.
func severity(r alert.Rule, level int) alert.Severity {
	if r == alert.RuleQuotaTier {
		return policy.TierSeverity(level)
	}
	if level >= levelOf(alert.SeverityCritical) {
		return alert.SeverityCritical
	}
	return alert.SeverityWarning
}

// levelOf is the level of a condition of severity s for the rules other
// than quota_tier: 1 for a warning, 2 for critical. It is never 0, which
// means "clear".
func levelOf(s alert.Severity) int {
	if s >= alert.SeverityCritical {
		return 2
	}
	return 1
}

// autoResolving reports whether r's alerts end by themselves when signals
// stop, having no "clear" signal of their own.
func autoResolving(r alert.Rule) bool {
	return r != alert.RuleQuotaTier && r != alert.RuleExhaustionPredicted
}

// predictionPassed reports whether st is an exhaustion prediction still
// held whose predicted time lies more than ExhaustionCritical behind now.
// The aggregator announces a prediction again when its time passes with
// usage still flowing, so only a tenant that stopped sending (or slowed
// down without another signal) gets here.
func (e *Engine) predictionPassed(st *state, now time.Time) bool {
	p := st.cur.PredictedExhaustion
	return st.cur.Key.Rule == alert.RuleExhaustionPredicted && st.level > 0 && p != nil &&
		now.Sub(*p) >= e.cfg.ExhaustionCritical
}

// due reports whether step has anything to do for st at now; it must agree
// with step's conditions.
func (e *Engine) due(st *state, now time.Time) bool {
	auto := autoResolving(st.cur.Key.Rule)
	switch {
	case auto && st.level > 0 && now.Sub(st.lastSeen) >= e.cfg.AutoResolveAfter:
	case !auto && st.level > 0 && !st.cur.PeriodEnd.IsZero() && !now.Before(st.cur.PeriodEnd):
	case e.predictionPassed(st, now):
	case !st.firing && st.level > 0 && now.Sub(st.since) >= e.cfg.PendingFor:
	case st.firing && st.level > st.firedLevel && now.Sub(st.levelSince) >= e.cfg.PendingFor:
	case st.firing && st.owed:
	case st.firing && st.level == 0 && now.Sub(st.clearSince) >= e.cfg.ResolveAfter:
	default:
		return false
	}
	return true
}

func (e *Engine) step(k alert.Key, st *state, now time.Time) {
	autoResolving := autoResolving(k.Rule)
	if autoResolving && st.level > 0 && now.Sub(st.lastSeen) >= e.cfg.AutoResolveAfter {
		if !st.firing {
			delete(e.alerts, k)
			return
		}
		st.level = 0
		st.clearSince = now.Add(-e.cfg.ResolveAfter) // silence already lasted long enough
	}
	if !autoResolving && st.level > 0 && !st.cur.PeriodEnd.IsZero() && !now.Before(st.cur.PeriodEnd) {
		// The period ended without a period_reset reaching us.
		e.clear(k, st, now)
		if e.alerts[k] == nil {
			return
		}
	}
	if e.predictionPassed(st, now) {
		// The predicted time passed without the quota running out (a
		// quota_exhausted would have cleared this) and without a newer
		// prediction: it did not come true.
		e.clear(k, st, now)
		if e.alerts[k] == nil {
			return
		}
	}
	route := e.route(k.Tenant)
	switch {
	case !st.firing && st.level > 0 && now.Sub(st.since) >= e.cfg.PendingFor:
		st.firing = true
		st.firedLevel = st.level
		st.cur.StartsAt = now
		st.cur.Status = alert.StatusFiring
		e.notifyFiring(st, &route, now)
	case st.firing && st.level > st.firedLevel && now.Sub(st.levelSince) >= e.cfg.PendingFor:
		// Escalation: a higher tier or severity held long enough. A lower
		// one never re-notifies, which is what keeps a tenant oscillating
		// around a threshold from being paged on every crossing.
		st.firedLevel = st.level
		e.notifyFiring(st, &route, now)
	case st.firing && st.owed:
		e.notifyFiring(st, &route, now)
	}
	if st.firing && st.level == 0 && now.Sub(st.clearSince) >= e.cfg.ResolveAfter {
		delete(e.alerts, k)
		if !st.delivered {
			return
		}
		a := st.sent
		a.Status = alert.StatusResolved
		a.EndsAt = now
		a.Used, a.Limit, a.Rate, a.Reason = st.cur.Used, st.cur.Limit, st.cur.Rate, st.cur.Reason
		e.deliver(&route, a, nil, now)
	}
}

// notifyFiring delivers st's firing notification unless a silence or quiet
// hours hold it back, in which case a later Tick retries.
func (e *Engine) notifyFiring(st *state, route *Route, now time.Time) {
	a := st.cur
	a.Severity = severity(a.Key.Rule, st.firedLevel)
	if a.Key.Rule == alert.RuleQuotaTier {
		a.Tier = st.firedLevel
	}
	a.Language = route.Language
	if route.suppressed(&a, now) != "" {
		st.owed = true
		return
	}
	st.owed = false
	var superseded []alert.Alert
	if st.delivered && !sameLabels(&st.sent, &a) {
		old := st.sent
		old.Status = alert.StatusResolved
		old.EndsAt = now
		superseded = []alert.Alert{old}
	}
	st.delivered = true
	st.sent = a
	e.deliver(route, a, superseded, now)
}

func sameLabels(a, b *alert.Alert) bool {
	return a.Severity == b.Severity && a.Tier == b.Tier
}

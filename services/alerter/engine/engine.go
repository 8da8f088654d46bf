// Package engine is the alerter's state machine: it turns quota signals into
// alerts that go pending → firing → resolved per tenant × model × period ×
// rule, and decides what each channel is told and when, against alert
// fatigue: a pending duration before firing, a hold before resolving, dedup
// per key, silences and quiet hours per tenant, and grouping of many tenants
// tripping the same rule into one incident message per channel.
//
// The engine never reads the wall clock: callers pass now to Observe and
// Tick, so tests drive time and a replay behaves like the original run.
package engine

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// AlertmanagerChannel is the channel name of Alertmanager. It gets every
// alert individually (Alertmanager groups by itself), periodic re-sends of
// firing alerts, and the superseded label sets of escalations.
const AlertmanagerChannel = "alertmanager"

// Output receives the engine's messages. Deliver is called with the
// engine's lock held, so it must not block: the notify package's Dispatcher
// queues and returns.
type Output interface {
	Deliver(channel string, m alert.Message)
}

// Config tunes the state machine.
type Config struct {
	// PendingFor is how long a condition (or a higher tier) must hold before
	// it is notified; shorter blips are never sent.
	PendingFor time.Duration `yaml:"pending_for" help:"how long a condition must hold before it is notified"`
	// ResolveAfter is how long a firing condition must stay clear before the
	// resolved notice goes out; a condition that returns sooner keeps the
	// alert firing without a new notification.
	ResolveAfter time.Duration `yaml:"resolve_after" help:"how long a firing condition must stay clear before the resolved notice"`
	// AutoResolveAfter ends alerts of rules that have no "clear" signal
	// (rate_exceeded, anomaly, breaker_open, reconciliation_drift) when no
	// signal refreshed them for this long.
	AutoResolveAfter time.Duration `yaml:"auto_resolve_after" help:"end anomaly, rate and drift alerts not refreshed by a signal for this long"`
	// ExhaustionWarning and ExhaustionCritical are the horizons within which
	// a predicted exhaustion is a warning or a critical alert; a prediction
	// beyond ExhaustionWarning clears the alert.
	ExhaustionWarning  time.Duration `yaml:"exhaustion_warning" help:"predicted exhaustion within this is a warning"`
	ExhaustionCritical time.Duration `yaml:"exhaustion_critical" help:"predicted exhaustion within this is critical"`
	// GroupWait is how long direct-channel notifications are held to be
	// grouped; 0 sends each at once.
	GroupWait time.Duration `yaml:"group_wait" help:"how long direct-channel notifications are held for grouping (0: no grouping)"`
	// GroupThreshold: when more than this many alerts of one rule, severity
	// and status are held for a channel in one window, they go out as one
	// incident message.
	GroupThreshold int `yaml:"group_threshold" help:"more alerts than this of one rule in a grouping window become one incident message"`
	// ResendInterval is how often firing alerts are re-sent to Alertmanager;
	// keep it well under Alertmanager's resolve_timeout.
	ResendInterval time.Duration `yaml:"resend_interval" help:"how often firing alerts are re-sent to Alertmanager (keep under its resolve_timeout)"`
	// MaxAlerts bounds the alerts tracked at once; signals for new keys
	// beyond it are dropped and counted (existing alerts keep updating).
	MaxAlerts int `yaml:"max_alerts" help:"alerts tracked at once; signals for new keys beyond it are dropped and counted"`
	// MaxGroupBuffer bounds the notifications held per channel for grouping;
	// a full buffer is flushed early rather than grown.
	MaxGroupBuffer int `yaml:"max_group_buffer" help:"notifications held per channel for grouping before an early flush"`
	// DedupSignals is how many recent signal IDs are remembered to drop
	// replayed signals.
	DedupSignals int `yaml:"dedup_signals" help:"recent signal IDs remembered to drop replays"`
}

// DefaultConfig returns the defaults: 1m pending, 5m resolve hold, 15m
// auto-resolve, 30m/10m exhaustion horizons, 30s grouping above 10 tenants,
// 1m Alertmanager re-send.
func DefaultConfig() Config {
	return Config{
		PendingFor:         time.Minute,
		ResolveAfter:       5 * time.Minute,
		AutoResolveAfter:   15 * time.Minute,
		ExhaustionWarning:  30 * time.Minute,
		ExhaustionCritical: 10 * time.Minute,
		GroupWait:          30 * time.Second,
		GroupThreshold:     10,
		ResendInterval:     time.Minute,
		MaxAlerts:          200000,
		MaxGroupBuffer:     10000,
		DedupSignals:       100000,
	}
}

// Validate checks every field and names the field and its limit.
func (c Config) Validate() error {
	var errs []error
	nonNeg := func(name string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s: %v must not be negative", name, d))
		}
	}
	nonNeg("pending_for", c.PendingFor)
	nonNeg("resolve_after", c.ResolveAfter)
	nonNeg("group_wait", c.GroupWait)
	if c.AutoResolveAfter <= 0 {
		errs = append(errs, fmt.Errorf("auto_resolve_after: %v must be positive", c.AutoResolveAfter))
	}
	if c.ExhaustionWarning <= 0 {
		errs = append(errs, fmt.Errorf("exhaustion_warning: %v must be positive", c.ExhaustionWarning))
	}
	if c.ExhaustionCritical <= 0 || c.ExhaustionCritical > c.ExhaustionWarning {
		errs = append(errs, fmt.Errorf("exhaustion_critical: %v must be positive and at most exhaustion_warning (%v)", c.ExhaustionCritical, c.ExhaustionWarning))
	}
	if c.GroupThreshold < 1 {
		errs = append(errs, fmt.Errorf("group_threshold: %d must be at least 1", c.GroupThreshold))
	}
	if c.ResendInterval < time.Second {
		errs = append(errs, fmt.Errorf("resend_interval: %v must be at least 1s", c.ResendInterval))
	}
	if c.MaxAlerts < 1 {
		errs = append(errs, fmt.Errorf("max_alerts: %d must be at least 1", c.MaxAlerts))
	}
	if c.MaxGroupBuffer < 1 {
		errs = append(errs, fmt.Errorf("max_group_buffer: %d must be at least 1", c.MaxGroupBuffer))
	}
	if c.DedupSignals < 0 {
		errs = append(errs, fmt.Errorf("dedup_signals: %d must not be negative", c.DedupSignals))
	}
	return errors.Join(errs...)
}

// Stats counts the engine's alerts and what it dropped.
type Stats struct {
	Pending, Firing int
	// DroppedNewAlerts counts signals for new keys refused at MaxAlerts.
	DroppedNewAlerts uint64
	// DuplicateSignals counts replayed signal IDs that were ignored.
	DuplicateSignals uint64
}

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

// Engine holds every alert. It is safe for concurrent use.
type Engine struct {
	cfg    Config
	route  Router
	out    Output
	mu     sync.Mutex
	alerts map[alert.Key]*state
	// groups holds direct-channel notifications waiting for GroupWait.
	groups map[string]*group
	// amBatch collects a Tick's Alertmanager news, posted as one message:
	// a fleet-wide incident is then one request, not hundreds.
	amBatch    alert.Message
	lastResend time.Time
	seen       map[string]struct{}
	seenOrder  []string
	seenNext   int
	stats      Stats
}

type group struct {
	first  time.Time
	alerts []alert.Alert
}

// New returns an engine that routes with route and delivers to out.
func New(cfg Config, route Router, out Output) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Engine{
		cfg:       cfg,
		route:     route,
		out:       out,
		alerts:    map[alert.Key]*state{},
		groups:    map[string]*group{},
		seen:      make(map[string]struct{}, cfg.DedupSignals),
		seenOrder: make([]string, cfg.DedupSignals),
	}, nil
}

// Forget drops every alert of the tenants for which owned returns false,
// without notifying: after a consumer-group rebalance another alerter owns
// them and rebuilds their state from the topic.
func (e *Engine) Forget(owned func(tenant string) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.alerts {
		if !owned(k.Tenant) {
			delete(e.alerts, k)
		}
	}
}

// Stats returns the current counts.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	for _, st := range e.alerts {
		if st.firing {
			s.Firing++
		} else {
			s.Pending++
		}
	}
	return s
}

// Observe applies one signal at time now. Signals of kinds the alerter does
// not alert on (late_event) and replayed IDs are ignored.
func (e *Engine) Observe(sig *schemas.Signal, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.duplicate(sig.ID) {
		e.stats.DuplicateSignals++
		return
	}
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
		level := 0
		if sig.PredictedExhaustion != nil {
			switch lead := sig.PredictedExhaustion.Sub(sig.Time); {
			case lead <= e.cfg.ExhaustionCritical:
				level = 2
			case lead <= e.cfg.ExhaustionWarning:
				level = 1
			}
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
		level := 1
		if sig.Limit > 0 && sig.Used < sig.Limit {
			level = 0
		}
		e.observe(withRule(base, alert.RuleRateExceeded, ""), level, sig, now)
	case schemas.SignalAnomaly:
		level := 1
		if clearing(sig.Attributes["state"]) {
			level = 0
		}
		if b := sig.Attributes["breaker"]; b != "" {
			if level > 0 {
				level = 2
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
		level := 1
		if clearing(sig.Attributes["state"]) {
			level = 0
		}
		e.observe(withRule(base, alert.RuleReconciliationDrift, ""), level, sig, now)
	}
}

// clearing reports whether an anomaly or drift signal's state attribute says
// the condition ended.
func clearing(s string) bool {
	return s == "resolved" || s == "closed" || s == "clear" || s == "ok"
}

func withRule(k alert.Key, r alert.Rule, variant string) alert.Key {
	k.Rule = r
	k.Variant = variant
	if r == alert.RuleAnomaly || r == alert.RuleBreakerOpen {
		// Anomalies are not tied to a quota's period.
		k.Quota = ""
	}
	return k
}

// duplicate remembers id in a bounded FIFO set and reports whether it was
// already there.
func (e *Engine) duplicate(id string) bool {
	if e.cfg.DedupSignals == 0 || id == "" {
		return false
	}
	if _, ok := e.seen[id]; ok {
		return true
	}
	if old := e.seenOrder[e.seenNext]; old != "" {
		delete(e.seen, old)
	}
	e.seenOrder[e.seenNext] = id
	e.seenNext = (e.seenNext + 1) % len(e.seenOrder)
	e.seen[id] = struct{}{}
	return false
}

func (e *Engine) observe(k alert.Key, level int, sig *schemas.Signal, now time.Time) {
	st := e.alerts[k]
	if level <= 0 {
		if st != nil {
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

// severity maps a key's level to a severity.
func severity(r alert.Rule, level int) alert.Severity {
	if r == alert.RuleQuotaTier {
		return policy.TierSeverity(level)
	}
	if level >= 2 {
		return alert.SeverityCritical
	}
	return alert.SeverityWarning
}

// Tick advances every alert to now: fires pending alerts whose condition
// held PendingFor, escalates, resolves, auto-resolves, delivers what
// silences and quiet hours held back, flushes grouping windows and re-sends
// firing alerts to Alertmanager. Call it every second or so.
func (e *Engine) Tick(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// Only the alerts with something due are stepped, in key order, which
	// keeps delivery order deterministic for tests and log readers without
	// sorting every alert on every tick.
	var due []*state
	for _, st := range e.alerts {
		if e.due(st, now) {
			due = append(due, st)
		}
	}
	sort.Slice(due, func(i, j int) bool { return due[i].id < due[j].id })
	for _, st := range due {
		e.step(st.cur.Key, st, now)
	}
	e.flushAlertmanager()
	e.flushGroups(now, false)
	if e.cfg.ResendInterval > 0 && now.Sub(e.lastResend) >= e.cfg.ResendInterval {
		e.lastResend = now
		e.resend(now)
	}
}

// autoResolving reports whether r's alerts end by themselves when signals
// stop, having no "clear" signal of their own.
func autoResolving(r alert.Rule) bool {
	return r != alert.RuleQuotaTier && r != alert.RuleExhaustionPredicted
}

// due reports whether step has anything to do for st at now; it must agree
// with step's conditions.
func (e *Engine) due(st *state, now time.Time) bool {
	auto := autoResolving(st.cur.Key.Rule)
	switch {
	case auto && st.level > 0 && now.Sub(st.lastSeen) >= e.cfg.AutoResolveAfter:
	case !auto && st.level > 0 && !st.cur.PeriodEnd.IsZero() && !now.Before(st.cur.PeriodEnd):
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

func (e *Engine) flushAlertmanager() {
	if len(e.amBatch.Alerts)+len(e.amBatch.Superseded) > 0 {
		e.out.Deliver(AlertmanagerChannel, e.amBatch)
		e.amBatch = alert.Message{}
	}
}

// deliver batches a for Alertmanager and holds it for grouping on
// direct channels.
func (e *Engine) deliver(route *Route, a alert.Alert, superseded []alert.Alert, now time.Time) {
	for _, ch := range route.Channels {
		if ch == AlertmanagerChannel {
			e.amBatch.Alerts = append(e.amBatch.Alerts, a)
			e.amBatch.Superseded = append(e.amBatch.Superseded, superseded...)
			continue
		}
		if e.cfg.GroupWait <= 0 {
			e.out.Deliver(ch, alert.Message{Alerts: []alert.Alert{a}})
			continue
		}
		g := e.groups[ch]
		if g == nil {
			g = &group{first: now}
			e.groups[ch] = g
		}
		g.alerts = append(g.alerts, a)
		if len(g.alerts) >= e.cfg.MaxGroupBuffer {
			e.flushGroup(ch, g)
		}
	}
}

// Flush delivers every held group now, whatever its age; Run calls it at
// shutdown so nothing held for grouping is lost.
func (e *Engine) Flush(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushAlertmanager()
	e.flushGroups(now, true)
}

func (e *Engine) flushGroups(now time.Time, all bool) {
	chans := make([]string, 0, len(e.groups))
	for ch, g := range e.groups {
		if all || now.Sub(g.first) >= e.cfg.GroupWait {
			chans = append(chans, ch)
		}
	}
	sort.Strings(chans)
	for _, ch := range chans {
		e.flushGroup(ch, e.groups[ch])
	}
}

type groupKey struct {
	rule     alert.Rule
	severity alert.Severity
	status   alert.Status
}

// flushGroup sends a channel's held notifications: classes larger than
// GroupThreshold as one incident each, the rest one by one.
func (e *Engine) flushGroup(ch string, g *group) {
	delete(e.groups, ch)
	classes := map[groupKey][]alert.Alert{}
	var order []groupKey
	for _, a := range g.alerts {
		gk := groupKey{a.Key.Rule, a.Severity, a.Status}
		if _, ok := classes[gk]; !ok {
			order = append(order, gk)
		}
		classes[gk] = append(classes[gk], a)
	}
	for _, gk := range order {
		as := classes[gk]
		if len(as) > e.cfg.GroupThreshold {
			e.out.Deliver(ch, alert.Message{Alerts: as})
			continue
		}
		for _, a := range as {
			e.out.Deliver(ch, alert.Message{Alerts: []alert.Alert{a}})
		}
	}
}

// resend re-posts every delivered firing alert to Alertmanager so that it
// does not time them out while they last.
func (e *Engine) resend(now time.Time) {
	var firing []*state
	for _, st := range e.alerts {
		if !st.firing || !st.delivered {
			continue
		}
		route := e.route(st.cur.Key.Tenant)
		if slices.Contains(route.Channels, AlertmanagerChannel) {
			firing = append(firing, st)
		}
	}
	if len(firing) == 0 {
		return
	}
	sort.Slice(firing, func(i, j int) bool { return firing[i].id < firing[j].id })
	m := alert.Message{Alerts: make([]alert.Alert, len(firing)), Resend: true}
	for i, st := range firing {
		m.Alerts[i] = st.sent
	}
	e.out.Deliver(AlertmanagerChannel, m)
}

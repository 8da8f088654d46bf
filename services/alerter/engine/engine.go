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
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/fifo"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// The engine's files: config.go its settings, signals.go the mapping of
// signals to alerts, state.go one alert's state machine, deliver.go what
// each channel is told (batching, grouping, re-sends), route.go a tenant's
// channels, silences and quiet hours. This file holds the entry points,
// each of which takes the engine's lock.

// AlertmanagerChannel is the channel name of Alertmanager. It gets every
// alert individually (Alertmanager groups by itself), periodic re-sends of
// firing alerts, and the superseded label sets of escalations.
const AlertmanagerChannel = policy.AlertmanagerChannel

// Output receives the engine's messages. Deliver is called with the
// engine's lock held, so it must not block: the notify package's Dispatcher
// queues and returns.
type Output interface {
	Deliver(channel string, m alert.Message)
}

// Stats counts the engine's alerts and what it dropped.
type Stats struct {
	Pending, Firing int
	// DroppedNewAlerts counts signals for new keys refused at MaxAlerts.
	DroppedNewAlerts uint64
	// DuplicateSignals counts replayed signal IDs that were ignored.
	DuplicateSignals uint64
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
	seen       *fifo.Set[string] // recent signal ids, so a replayed signal is skipped
	stats      Stats
	// dirty holds the keys whose state changed since the last TakeDirty
	// (see persist.go).
	dirty map[alert.Key]struct{}
	// heldDirty says groups changed since the last TakeHeld.
	heldDirty bool
}

// New returns an engine that routes with route and delivers to out.
func New(cfg Config, route Router, out Output) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Engine{
		cfg:    cfg,
		route:  route,
		out:    out,
		alerts: map[alert.Key]*state{},
		groups: map[string]*group{},
		seen:   fifo.NewSet[string](cfg.DedupSignals),
		dirty:  map[alert.Key]struct{}{},
	}, nil
}

// Forget drops every alert of the tenants for which owned returns false,
// without notifying and without marking them dirty: after a consumer-group
// rebalance another alerter owns them and restores their state from what
// this one persisted; a deletion persisted now would erase it.
func (e *Engine) Forget(owned func(tenant string) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.alerts {
		if !owned(k.Tenant) {
			delete(e.alerts, k)
		}
	}
	for k := range e.dirty {
		if !owned(k.Tenant) {
			delete(e.dirty, k)
		}
	}
	// Their notifications held for grouping go too: the new owner restores
	// and sends them.
	for ch, g := range e.groups {
		g.alerts = slices.DeleteFunc(g.alerts, func(a alert.Alert) bool { return !owned(a.Key.Tenant) })
		if len(g.alerts) == 0 {
			delete(e.groups, ch)
		}
	}
}

// Tenants returns the tenants the engine holds anything of: tracked
// alerts, changes TakeDirty has not taken yet, and notifications held for
// grouping. The alerter remembers the signals partition of these tenants
// only (where their state is written).
func (e *Engine) Tenants() map[string]struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]struct{}, len(e.alerts))
	for k := range e.alerts {
		out[k.Tenant] = struct{}{}
	}
	for k := range e.dirty {
		out[k.Tenant] = struct{}{}
	}
	for _, g := range e.groups {
		for _, a := range g.alerts {
			out[a.Key.Tenant] = struct{}{}
		}
	}
	return out
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
// not alert on (late_event) and replayed IDs are ignored. Observe never
// delivers: only Tick and Flush do.
func (e *Engine) Observe(sig *schemas.Signal, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sig.ID != "" && e.seen.Seen(sig.ID) {
		e.stats.DuplicateSignals++
		return
	}
	e.apply(sig, now)
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
		e.markDirty(st.cur.Key)
		e.step(st.cur.Key, st, now)
	}
	e.flushAlertmanager()
	e.flushGroups(now, false)
	if e.cfg.ResendInterval > 0 && now.Sub(e.lastResend) >= e.cfg.ResendInterval {
		e.lastResend = now
		e.resend(now)
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

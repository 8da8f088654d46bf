package engine

import (
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// This file decides what each channel is told: Alertmanager gets every
// alert, batched per Tick, and periodic re-sends; direct channels get
// notifications held GroupWait, grouped into one incident message per rule,
// severity and status when there are more than GroupThreshold of them.

type group struct {
	first  time.Time
	alerts []alert.Alert
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
		e.heldDirty = true
		if len(g.alerts) >= e.cfg.MaxGroupBuffer {
			e.flushGroup(ch, g)
		}
	}
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
	e.heldDirty = true
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

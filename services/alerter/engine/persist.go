package engine

import (
	"slices"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// This file lets the alerter persist what the engine knows, so that a
// restart neither forgets an alert nor announces it again: every change to
// an alert's state marks its key dirty, TakeDirty hands the changed states
// to the caller (which writes them to a compacted topic), and Restore loads
// them back. The caller commits signal offsets only after the states those
// signals produced are written, so a restart resumes from the committed
// offsets with exactly the state that held there.

// RecordVersion is the version of Record's encoding; a reader skips a
// record of another version rather than misread it.
const RecordVersion = 1

// Record is one alert's state as persisted: everything the engine needs to
// go on where it stopped, including what was last notified (Sent,
// Delivered, FiredLevel), so that a restored firing alert is neither
// announced again nor forgotten when its condition clears.
type Record struct {
	V          int         `json:"v"`
	Key        alert.Key   `json:"key"`
	Alert      alert.Alert `json:"alert"`
	Sent       alert.Alert `json:"sent"`
	Level      int         `json:"level"`
	FiredLevel int         `json:"fired_level"`
	Since      time.Time   `json:"since"`
	LevelSince time.Time   `json:"level_since"`
	ClearSince time.Time   `json:"clear_since"`
	LastSeen   time.Time   `json:"last_seen"`
	Firing     bool        `json:"firing"`
	Delivered  bool        `json:"delivered"`
	Owed       bool        `json:"owed"`
}

// Change is one key's new state; Record nil means the alert is gone
// (resolved, or a pending alert that cleared) and its record is deleted.
type Change struct {
	Key    alert.Key
	Record *Record
}

// markDirty notes that k's state changed since the last TakeDirty.
func (e *Engine) markDirty(k alert.Key) { e.dirty[k] = struct{}{} }

// TakeDirty returns the state of every key changed since the last call and
// forgets that they changed. A caller that fails to write them hands them
// back with Redirty.
func (e *Engine) TakeDirty() []Change {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.dirty) == 0 {
		return nil
	}
	out := make([]Change, 0, len(e.dirty))
	for k := range e.dirty {
		c := Change{Key: k}
		if st := e.alerts[k]; st != nil {
			c.Record = st.record()
		}
		out = append(out, c)
	}
	clear(e.dirty)
	return out
}

// Redirty marks the keys of changes dirty again, so that the next
// TakeDirty returns their state as it is then.
func (e *Engine) Redirty(changes []Change) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range changes {
		e.dirty[c.Key] = struct{}{}
	}
}

// Restore loads persisted states, replacing any state of the same keys,
// without notifying and without marking them dirty: they are what the
// store already holds. Records beyond MaxAlerts are dropped and counted.
func (e *Engine) Restore(recs []*Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range recs {
		if _, ok := e.alerts[r.Key]; !ok && len(e.alerts) >= e.cfg.MaxAlerts {
			e.stats.DroppedNewAlerts++
			continue
		}
		e.alerts[r.Key] = &state{
			cur: r.Alert, sent: r.Sent, level: r.Level, firedLevel: r.FiredLevel,
			since: r.Since, levelSince: r.LevelSince, clearSince: r.ClearSince, lastSeen: r.LastSeen,
			firing: r.Firing, delivered: r.Delivered, owed: r.Owed, id: r.Key.String(),
		}
		e.alerts[r.Key].cur.Key = r.Key
	}
}

func (st *state) record() *Record {
	return &Record{
		V: RecordVersion, Key: st.cur.Key, Alert: st.cur, Sent: st.sent,
		Level: st.level, FiredLevel: st.firedLevel,
		Since: st.since, LevelSince: st.levelSince, ClearSince: st.clearSince, LastSeen: st.lastSeen,
		Firing: st.firing, Delivered: st.delivered, Owed: st.owed,
	}
}

// Held is the notifications of one direct channel held for grouping
// (GroupWait), as persisted: a crash during the wait must neither lose
// them (the alert states already say they were sent) nor send them twice.
type Held struct {
	V       int           `json:"v"`
	Channel string        `json:"channel"`
	First   time.Time     `json:"first"`
	Alerts  []alert.Alert `json:"alerts"`
}

// TakeHeld returns every channel's held notifications if any group
// changed since the last call (ok false otherwise): the caller replaces
// what it stored with them, an absent channel meaning none held.
func (e *Engine) TakeHeld() (held []Held, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.heldDirty {
		return nil, false
	}
	e.heldDirty = false
	held = make([]Held, 0, len(e.groups))
	for ch, g := range e.groups {
		held = append(held, Held{V: RecordVersion, Channel: ch, First: g.first, Alerts: slices.Clone(g.alerts)})
	}
	return held, true
}

// RedirtyHeld makes the next TakeHeld return the groups again, after the
// caller failed to store them.
func (e *Engine) RedirtyHeld() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.heldDirty = true
}

// RestoreHeld adds persisted held notifications to their channel's group,
// which keeps the earliest First: they go out when the wait that began
// before the restart ends.
func (e *Engine) RestoreHeld(hs []Held) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, h := range hs {
		if len(h.Alerts) == 0 {
			continue
		}
		g := e.groups[h.Channel]
		if g == nil {
			g = &group{first: h.First}
			e.groups[h.Channel] = g
		}
		if h.First.Before(g.first) {
			g.first = h.First
		}
		g.alerts = append(g.alerts, h.Alerts...)
	}
}

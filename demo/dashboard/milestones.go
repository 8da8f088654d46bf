package dashboard

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// Milestones follows one tenant through the demo's story and says how
// early Sluice saw it coming: how long after the tenant's first call its
// first predicted exhaustion was on screen, at what share of its quota,
// and at what share the predictive alert first fired. It reads the rows
// the view shows, so what it reports is what a person watching saw (to
// the view's refresh interval). It is safe for concurrent use.
type Milestones struct {
	// Tenant is the tenant followed.
	Tenant string
	// Alert is the alertname of the predictive alert (Row.Alerts lists
	// "alertname/severity").
	Alert string
	// Started returns the tenant's first call, zero before it.
	Started func() time.Time

	mu                  sync.Mutex
	prediction, alerted *Milestone
}

// Milestone is the first view showing something.
type Milestone struct {
	// At is when the view first showed it; After is how long that was
	// after the tenant's first call.
	At    time.Time
	After time.Duration
	// UsedPercent is the share of Quota used the same view showed, and
	// Calls the tenant's calls answered by then (served and refused).
	UsedPercent float64
	Quota       string
	Calls       int64
	// What is the prediction's EXHAUSTS cell and basis, or the alert as
	// "alertname/severity".
	What string
}

// Observe notes the milestones the rows, shown at now, reach first.
func (m *Milestones) Observe(rows []Row, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rows {
		if r.Tenant != m.Tenant {
			continue
		}
		var start time.Time
		if m.Started != nil {
			start = m.Started()
		}
		at := func(what string) *Milestone {
			ms := &Milestone{At: now, UsedPercent: r.UsedPercent(), Quota: r.Quota + "/" + r.Period, Calls: r.Served + r.Refused, What: what}
			if !start.IsZero() {
				ms.After = now.Sub(start)
			}
			return ms
		}
		if m.prediction == nil && !r.Exhaustion.IsZero() {
			m.prediction = at(strings.TrimSpace(exhausts(r, now) + " " + r.ExhaustionBasis))
		}
		if m.alerted == nil {
			for _, a := range r.Alerts {
				if strings.HasPrefix(a, m.Alert+"/") {
					m.alerted = at(a)
					break
				}
			}
		}
	}
}

// Prediction returns the first prediction shown, if any yet.
func (m *Milestones) Prediction() (Milestone, bool) { return m.get(&m.prediction) }

// Alerted returns the first view with the predictive alert firing, if any yet.
func (m *Milestones) Alerted() (Milestone, bool) { return m.get(&m.alerted) }

func (m *Milestones) get(p **Milestone) (Milestone, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if *p == nil {
		return Milestone{}, false
	}
	return **p, true
}

// Notes returns the lines the view prints under its table: one per
// milestone reached, in the order they are reached.
func (m *Milestones) Notes() []string {
	var out []string
	if p, ok := m.Prediction(); ok {
		out = append(out, fmt.Sprintf("%s: first prediction shown %.1f s after its first call (%d calls), at %.1f%% of %s: exhausts %s",
			m.Tenant, p.After.Seconds(), p.Calls, p.UsedPercent, p.Quota, p.What))
	}
	if a, ok := m.Alerted(); ok {
		out = append(out, fmt.Sprintf("%s: predictive alert %s fired at %.1f%% of %s, %.1f s after its first call",
			m.Tenant, a.What, a.UsedPercent, a.Quota, a.After.Seconds()))
	}
	return out
}

// Noter is a Source whose view prints notes under the table
// (Milestones.Notes).
type Noter interface {
	Notes() []string
}

// Package report answers finance's questions from ClickHouse: usage and
// cost per model over a month, week or day of the tenant's own calendar,
// by organisation, tenant, API key, end user or agent session (Levels),
// and the overage soft quotas let through. Usage is priced by the
// same query as the usage_priced view (package costquery) and overage read
// from the soft_quota_overage view, so a report and a hand-written query
// over the views of migrations 040-044 give the same figures. Write prints
// reports as an aligned table, CSV or JSON.
package report

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/reconciler/costquery"
)

// The levels a report groups usage by (Report.By): an organisation (the
// tenants the policy names with its organization:), a tenant (a team),
// and below it the API key, the end user and the agent session the usage
// events carry.
const (
	ByOrganization = "organization"
	ByTenant       = "tenant"
	ByKey          = "key"
	ByUser         = "user"
	BySession      = "session"
)

// Levels lists the levels a report groups by, from the widest.
var Levels = []string{ByOrganization, ByTenant, ByKey, ByUser, BySession}

// levelColumn is the usage_events column (as costquery.Events names it)
// of each level below the tenant.
var levelColumn = map[string]string{ByKey: "api_key_id", ByUser: "user", BySession: "session_id"}

// Periods lists the period kinds a report covers, each a period of the
// tenant's calendar (its zone, its week_start).
var Periods = []string{string(schemas.PeriodMonth), string(policy.PeriodWeek), string(schemas.PeriodDay)}

// Line is one model's usage and cost in one currency; a Totals line has
// Model "TOTAL". Currency is empty for usage no price covered.
type Line struct {
	// Group is the key, user or session the line counts when the report
	// is by one of those levels (Report.By); "" is usage without one.
	Group            string `json:"group,omitempty"`
	Model            string `json:"model"`
	Currency         string `json:"currency"`
	Requests         uint64 `json:"requests"`
	PromptTokens     uint64 `json:"prompt_tokens"`
	CompletionTokens uint64 `json:"completion_tokens"`
	CachedTokens     uint64 `json:"cached_tokens"`
	// CacheWriteTokens and ReasoningTokens, like CachedTokens, are parts
	// of PromptTokens and CompletionTokens, priced apart (policy.Price).
	CacheWriteTokens uint64  `json:"cache_write_tokens"`
	ReasoningTokens  uint64  `json:"reasoning_tokens"`
	TotalTokens      uint64  `json:"total_tokens"`
	Cost             float64 `json:"cost"`
	// UnpricedRequests counts events that no price covered; their cost
	// is 0, which a bill must not take for "free".
	UnpricedRequests uint64 `json:"unpriced_requests"`
}

// add adds o's counts to l.
func (l *Line) add(o Line) {
	l.Requests += o.Requests
	l.PromptTokens += o.PromptTokens
	l.CompletionTokens += o.CompletionTokens
	l.CachedTokens += o.CachedTokens
	l.CacheWriteTokens += o.CacheWriteTokens
	l.ReasoningTokens += o.ReasoningTokens
	l.TotalTokens += o.TotalTokens
	l.Cost += o.Cost
	l.UnpricedRequests += o.UnpricedRequests
}

// Overage is a soft quota's usage above its limit in one period.
type Overage struct {
	Model       string    `json:"model"`
	Quota       string    `json:"quota"`
	Period      string    `json:"period"`
	PeriodStart time.Time `json:"period_start"`
	Unit        string    `json:"unit"`
	Used        float64   `json:"used"`
	Limit       float64   `json:"limit"`
	Overage     float64   `json:"overage"`
}

// Report is one tenant's or one organisation's usage over one period.
type Report struct {
	// Tenant is the tenant reported on; empty in an organisation's
	// report, whose Tenants are its teams.
	Tenant       string   `json:"tenant"`
	Organization string   `json:"organization,omitempty"`
	Tenants      []string `json:"tenants,omitempty"`
	// By is the level the lines are grouped by (Levels).
	By string `json:"by"`
	// Period is the kind of period (Periods); Month names a monthly one
	// (2006-01), Start and End bound every kind.
	Period string `json:"period"`
	Month  string `json:"month,omitempty"`
	// Zone is the tenant's zone (an organisation's teams' zones, each
	// team's period cut in its own).
	Zone string `json:"zone"`
	// Start and End bound the period [Start, End) in Zone.
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Lines    []Line    `json:"lines"`
	Totals   []Line    `json:"totals"`
	Overages []Overage `json:"overages"`
}

// Label names r's period: its month (2006-01) or its first day.
func (r *Report) Label() string {
	if r.Month != "" {
		return r.Month
	}
	return r.Start.Format(time.DateOnly)
}

// Period names one period of a tenant's calendar: a month (At "2006-01":
// the tenant's month that begins in it, from its billing day), or the
// week or day containing the day At ("2006-01-02").
type Period struct {
	Kind string
	At   string
}

// day parses At: the month's last day (inside the month that begins in it
// whatever the billing day) or the day, at noon (a time every zone's
// clock shows).
func (p Period) day() (time.Time, error) {
	if p.Kind == string(schemas.PeriodMonth) {
		t, err := time.Parse("2006-01", p.At)
		if err != nil {
			return time.Time{}, fmt.Errorf("month %q: want YYYY-MM, for example 2026-11", p.At)
		}
		return t.AddDate(0, 1, -1).Add(12 * time.Hour), nil
	}
	t, err := time.Parse(time.DateOnly, p.At)
	if err != nil {
		return time.Time{}, fmt.Errorf("date %q: want YYYY-MM-DD, a day of the %s, for example 2026-11-30", p.At, p.Kind)
	}
	return t.Add(12 * time.Hour), nil
}

// Validate reports a kind outside Periods or an At its kind cannot read,
// naming the flag (period, month or date) and what it accepts.
func (p Period) Validate() error {
	if !slices.Contains(Periods, p.Kind) {
		return fmt.Errorf("period: %q is not one of %s", p.Kind, strings.Join(Periods, ", "))
	}
	_, err := p.day()
	return err
}

// Bounds returns p in t's calendar (policy.Tenant.Calendar): its zone
// (UTC without one), its weeks from its week_start, its months from its
// billing_day, so a report's period is the one its quotas and limits
// count.
func (p Period) Bounds(t *policy.Tenant) (start, end time.Time, err error) {
	d, err := p.day()
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	cal := t.Calendar(schemas.Period(p.Kind))
	loc := cal.Location
	at := time.Date(d.Year(), d.Month(), d.Day(), 12, 0, 0, 0, loc)
	start, end = cal.Bounds(at)
	return start.In(loc), end.In(loc), nil
}

// Build builds t's report over period p with lines per model and
// currency, and per key, user or session when by is one of those levels.
// The tenant-level report also lists the soft quotas' overage; the levels
// below the tenant have none of their own.
func Build(ctx context.Context, conn driver.Conn, t *policy.Tenant, by string, p Period) (*Report, error) {
	start, end, err := p.Bounds(t)
	if err != nil {
		return nil, err
	}
	r := &Report{Tenant: t.ID, Organization: t.Organization, By: by, Period: p.Kind, Zone: start.Location().String(),
		Start: start, End: end, Lines: []Line{}, Totals: []Line{}, Overages: []Overage{}}
	if p.Kind == string(schemas.PeriodMonth) {
		r.Month = p.At
	}
	group, groupBy := "''", "model, currency"
	switch col, ok := levelColumn[by]; {
	case ok:
		group, groupBy = col, col+", model, currency"
	case by != ByTenant:
		return nil, fmt.Errorf("report: by %q: a tenant's report is by one of %s", by, strings.Join(Levels[1:], ", "))
	}
	rows, err := conn.Query(ctx, `
SELECT `+group+`, model, currency, count(), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),
       sum(cache_write_tokens), sum(reasoning_tokens), sum(total_tokens), sum(cost), countIf(priced = 0)
FROM (`+costquery.EventsBetween()+`)
GROUP BY `+groupBy+`
ORDER BY `+groupBy, costquery.BetweenArgs(t.ID, start, end)...)
	if err != nil {
		return nil, fmt.Errorf("report: usage of %s in %s: %w", t.ID, r.Label(), err)
	}
	for rows.Next() {
		var l Line
		if err := rows.Scan(&l.Group, &l.Model, &l.Currency, &l.Requests, &l.PromptTokens, &l.CompletionTokens, &l.CachedTokens,
			&l.CacheWriteTokens, &l.ReasoningTokens, &l.TotalTokens, &l.Cost, &l.UnpricedRequests); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report: scan usage: %w", err)
		}
		r.Lines = append(r.Lines, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("report: usage of %s in %s: %w", t.ID, r.Label(), err)
	}
	r.total()
	if by != ByTenant {
		return r, nil
	}
	r.Overages, err = overages(ctx, conn, t.ID, start, end)
	return r, err
}

// total sets r.Totals, one line per currency, from r.Lines.
func (r *Report) total() {
	totals := map[string]*Line{}
	for _, l := range r.Lines {
		t := totals[l.Currency]
		if t == nil {
			t = &Line{Model: "TOTAL", Currency: l.Currency}
			totals[l.Currency] = t
		}
		t.add(l)
	}
	r.Totals = r.Totals[:0]
	for _, t := range totals {
		r.Totals = append(r.Totals, *t)
	}
	sort.Slice(r.Totals, func(i, j int) bool { return r.Totals[i].Currency < r.Totals[j].Currency })
}

// overages reads the soft quotas' overage of tenant in [start, end).
func overages(ctx context.Context, conn driver.Conn, tenant string, start, end time.Time) ([]Overage, error) {
	out := []Overage{}
	orows, err := conn.Query(ctx, `
SELECT model, quota, period, period_start, unit, used, quota_limit, overage
FROM soft_quota_overage
WHERE tenant = ? AND period_start >= ? AND period_start < ?
ORDER BY period_start, model, quota`, tenant, start.UTC(), end.UTC())
	if err != nil {
		return nil, fmt.Errorf("report: soft-quota overage of %s from %s: %w", tenant, start.Format(time.DateOnly), err)
	}
	defer orows.Close()
	for orows.Next() {
		var o Overage
		if err := orows.Scan(&o.Model, &o.Quota, &o.Period, &o.PeriodStart, &o.Unit, &o.Used, &o.Limit, &o.Overage); err != nil {
			return nil, fmt.Errorf("report: scan overage: %w", err)
		}
		o.PeriodStart = o.PeriodStart.In(start.Location())
		out = append(out, o)
	}
	return out, orows.Err()
}

// Organization merges the tenant-level reports of org's teams into one:
// a line per model and currency summed over the teams, each team's
// usage over its own period in its own zone (a team's month is its
// zone's month). The teams' soft-quota overages are in their own reports.
func Organization(org string, teams []*Report) *Report {
	r := &Report{Organization: org, By: ByOrganization, Tenants: []string{}, Lines: []Line{}, Totals: []Line{}, Overages: []Overage{}}
	lines := map[[2]string]*Line{}
	var zones []string
	for _, t := range teams {
		r.Tenants = append(r.Tenants, t.Tenant)
		r.Period, r.Month = t.Period, t.Month
		if r.Start.IsZero() || t.Start.Before(r.Start) {
			r.Start = t.Start
		}
		if t.End.After(r.End) {
			r.End = t.End
		}
		if !slices.Contains(zones, t.Zone) {
			zones = append(zones, t.Zone)
		}
		for _, l := range t.Lines {
			k := [2]string{l.Model, l.Currency}
			if lines[k] == nil {
				lines[k] = &Line{Model: l.Model, Currency: l.Currency}
			}
			lines[k].add(l)
		}
	}
	slices.Sort(zones)
	r.Zone = strings.Join(zones, ", ")
	for _, l := range lines {
		r.Lines = append(r.Lines, *l)
	}
	sort.Slice(r.Lines, func(i, j int) bool {
		a, b := r.Lines[i], r.Lines[j]
		return a.Model < b.Model || a.Model == b.Model && a.Currency < b.Currency
	})
	r.total()
	return r
}

// Tenants lists the tenants with events in [start, end), widened by 14
// hours on each side so that a tenant whose zone is far from UTC is not
// missed; the per-tenant report then cuts its own month exactly.
func Tenants(ctx context.Context, conn driver.Conn, start, end time.Time) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT DISTINCT tenant FROM usage_events WHERE time >= ? AND time < ? ORDER BY tenant`,
		start.Add(-14*time.Hour).UTC(), end.Add(14*time.Hour).UTC())
	if err != nil {
		return nil, fmt.Errorf("report: list tenants: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("report: list tenants: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

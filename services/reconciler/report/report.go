// Package report answers finance's monthly questions from ClickHouse: usage
// and cost per tenant and model over a calendar month in the tenant's own
// zone, and the overage soft quotas let through. Usage is priced by the
// same query as the usage_priced view (package costquery) and overage read
// from the soft_quota_overage view, so a report and a hand-written query
// over the views of migrations 040-044 give the same figures. Write prints
// reports as an aligned table, CSV or JSON.
package report

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/services/reconciler/costquery"
)

// Line is one model's usage and cost in one currency; a Totals line has
// Model "TOTAL". Currency is empty for usage no price covered.
type Line struct {
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

// Month is one tenant's report for one calendar month.
type Month struct {
	Tenant string `json:"tenant"`
	Month  string `json:"month"` // 2006-01
	Zone   string `json:"zone"`
	// Start and End bound the month [Start, End) in Zone.
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Lines    []Line    `json:"lines"`
	Totals   []Line    `json:"totals"`
	Overages []Overage `json:"overages"`
}

// ParseMonth reads "2006-01" as the month's first instant in loc.
func ParseMonth(s string, loc *time.Location) (start, end time.Time, err error) {
	t, err := time.Parse("2006-01", s)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("month %q: want YYYY-MM, for example 2026-11", s)
	}
	if loc == nil {
		loc = time.UTC
	}
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, loc)
	return start, start.AddDate(0, 1, 0), nil
}

// Monthly builds tenant's report for month ("2006-01") in loc.
func Monthly(ctx context.Context, conn driver.Conn, tenant, month string, loc *time.Location) (*Month, error) {
	start, end, err := ParseMonth(month, loc)
	if err != nil {
		return nil, err
	}
	m := &Month{Tenant: tenant, Month: month, Zone: start.Location().String(), Start: start, End: end, Lines: []Line{}, Totals: []Line{}, Overages: []Overage{}}
	rows, err := conn.Query(ctx, `
SELECT model, currency, count(), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),
       sum(cache_write_tokens), sum(reasoning_tokens), sum(total_tokens), sum(cost), countIf(priced = 0)
FROM (`+costquery.EventsBetween()+`)
GROUP BY model, currency
ORDER BY model, currency`, costquery.BetweenArgs(tenant, start, end)...)
	if err != nil {
		return nil, fmt.Errorf("report: usage of %s in %s: %w", tenant, month, err)
	}
	totals := map[string]*Line{}
	for rows.Next() {
		var l Line
		if err := rows.Scan(&l.Model, &l.Currency, &l.Requests, &l.PromptTokens, &l.CompletionTokens, &l.CachedTokens,
			&l.CacheWriteTokens, &l.ReasoningTokens, &l.TotalTokens, &l.Cost, &l.UnpricedRequests); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report: scan usage: %w", err)
		}
		m.Lines = append(m.Lines, l)
		t := totals[l.Currency]
		if t == nil {
			t = &Line{Model: "TOTAL", Currency: l.Currency}
			totals[l.Currency] = t
		}
		t.Requests += l.Requests
		t.PromptTokens += l.PromptTokens
		t.CompletionTokens += l.CompletionTokens
		t.CachedTokens += l.CachedTokens
		t.CacheWriteTokens += l.CacheWriteTokens
		t.ReasoningTokens += l.ReasoningTokens
		t.TotalTokens += l.TotalTokens
		t.Cost += l.Cost
		t.UnpricedRequests += l.UnpricedRequests
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("report: usage of %s in %s: %w", tenant, month, err)
	}
	for _, t := range totals {
		m.Totals = append(m.Totals, *t)
	}
	sort.Slice(m.Totals, func(i, j int) bool { return m.Totals[i].Currency < m.Totals[j].Currency })

	orows, err := conn.Query(ctx, `
SELECT model, quota, period, period_start, unit, used, quota_limit, overage
FROM soft_quota_overage
WHERE tenant = ? AND period_start >= ? AND period_start < ?
ORDER BY period_start, model, quota`, tenant, start.UTC(), end.UTC())
	if err != nil {
		return nil, fmt.Errorf("report: soft-quota overage of %s in %s: %w", tenant, month, err)
	}
	defer orows.Close()
	for orows.Next() {
		var o Overage
		if err := orows.Scan(&o.Model, &o.Quota, &o.Period, &o.PeriodStart, &o.Unit, &o.Used, &o.Limit, &o.Overage); err != nil {
			return nil, fmt.Errorf("report: scan overage: %w", err)
		}
		o.PeriodStart = o.PeriodStart.In(start.Location())
		m.Overages = append(m.Overages, o)
	}
	return m, orows.Err()
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

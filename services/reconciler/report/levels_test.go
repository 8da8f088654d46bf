package report

import (
	"bytes"
	"context"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/policy"
)

// The organisation corp has two teams: ny in New York, whose week of
// 2026-10-26 (Monday to Monday) ends after the autumn change, so it runs
// [10-26T04:00Z, 11-02T05:00Z) — 169 hours — and acme in Shanghai, whose
// week runs [10-25T16:00Z, 11-01T16:00Z). gpt-4o costs $2 and $8 per
// million prompt and completion tokens; mystery has no price.
const levelsPolicy = `
price_catalog: none
tenants:
  ny: {timezone: America/New_York, organization: corp}
  acme: {timezone: Asia/Shanghai, organization: corp}
  solo: {}
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2, completion: 8}
`

var levelsFixture = []ev{
	{"ny", "n1", "2026-10-26T03:59:59Z", "gpt-4o", 1000, 0, 0, 1, 0, "", "k1", "u1", "s1"},    // Sunday 23:59:59 EDT: the week before
	{"ny", "n2", "2026-10-26T04:00:00Z", "gpt-4o", 1000, 1000, 0, 2, 0, "", "k1", "u1", "s1"}, // Monday 00:00 EDT: 0.010
	{"ny", "n3", "2026-11-01T06:30:00Z", "gpt-4o", 500, 500, 0, 3, 0, "", "k1", "u2", "s2"},   // Nov 1 01:30 EST, after the change: 0.005
	{"ny", "n4", "2026-11-02T04:59:59Z", "mystery", 100, 100, 0, 4, 0, "", "k2", "u2", ""},    // Nov 1 23:59:59 EST: unpriced
	{"ny", "n5", "2026-11-02T05:00:00Z", "gpt-4o", 1000, 0, 0, 5, 0, "", "k2", "u1", "s3"},    // Monday 00:00 EST: the next week
	{"ny", "n6", "2026-10-30T12:00:00Z", "gpt-4o", 100, 100, 0, 6, 1, "", "k2", "u1", "s3"},   // an estimate ...
	{"ny", "n6", "2026-10-30T12:00:00Z", "gpt-4o", 300, 200, 0, 7, 0, "", "k2", "u1", "s3"},   // ... settled: 0.0022
	{"acme", "a1", "2026-10-25T16:00:00Z", "gpt-4o", 2000, 0, 0, 1, 0, "", "k3", "u1", "s9"},  // Monday 00:00 in Shanghai: 0.004
	{"acme", "a2", "2026-11-01T16:00:00Z", "gpt-4o", 1000, 0, 0, 2, 0, "", "k3", "u1", "s9"},  // Monday 00:00 in Shanghai: the next week
	{"solo", "o1", "2026-10-28T00:00:00Z", "gpt-4o", 1000, 0, 0, 1, 0, "", "k9", "u9", "s9"},  // no organisation
	{"other", "z1", "2026-10-28T00:00:00Z", "gpt-4o", 9000, 0, 0, 1, 0, "", "k1", "u1", "s1"}, // another tenant's k1, u1, s1
	{"ny", "n7", "2026-10-27T00:00:00Z", "mystery", 10, 20, 0, 8, 0, "", "k1", "u1", "s1"},    // unpriced
	{"ny", "n8", "2026-10-27T00:00:00Z", "gpt-4o", 0, 0, 0, 9, 0, "", "", "", ""},             // no key, user or session: 0
}

// TestReportsPerLevel: one week of New York's tenant grouped by key, user
// and session, its day of the autumn change, and the organisation corp
// summing both teams' weeks, each cut in its own zone: exact sums per
// group, unpriced usage on lines of its own (never a cost of 0), an
// estimate counted as its settlement, and nothing of the weeks before and
// after or of other tenants.
func TestReportsPerLevel(t *testing.T) {
	ctx := context.Background()
	_, conn := migrationtest.Open(t)
	pol, err := policy.Parse([]byte(levelsPolicy), "levels.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now()); err != nil {
		t.Fatal(err)
	}
	insertEvents(t, conn, levelsFixture)
	week := Period{Kind: "week", At: "2026-10-28"}

	type want struct {
		group, model, currency string
		requests, tokens       uint64
		cost                   float64
		unpriced               uint64
	}
	check := func(r *Report, wants []want) {
		t.Helper()
		if len(r.Lines) != len(wants) {
			t.Fatalf("%s by %s: lines %+v, want %+v", r.Tenant, r.By, r.Lines, wants)
		}
		for i, w := range wants {
			l := r.Lines[i]
			if l.Group != w.group || l.Model != w.model || l.Currency != w.currency || l.Requests != w.requests || l.TotalTokens != w.tokens ||
				!near(l.Cost, w.cost) || l.UnpricedRequests != w.unpriced {
				t.Errorf("%s by %s, line %d: %+v, want %+v", r.Tenant, r.By, i, l, w)
			}
		}
	}
	build := func(tenant, by string, p Period) *Report {
		t.Helper()
		r, err := Build(ctx, conn, pol.Tenant(tenant), by, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	byKey := build("ny", ByKey, week)
	if byKey.Start.UTC() != utc("2026-10-26T04:00:00Z") || byKey.End.UTC() != utc("2026-11-02T05:00:00Z") || byKey.Zone != "America/New_York" {
		t.Errorf("New York's week: %s .. %s (%s), want 10-26T04:00Z .. 11-02T05:00Z", byKey.Start.UTC(), byKey.End.UTC(), byKey.Zone)
	}
	check(byKey, []want{
		{"", "gpt-4o", "USD", 1, 0, 0, 0},
		{"k1", "gpt-4o", "USD", 2, 3000, 0.015, 0},
		{"k1", "mystery", "", 1, 30, 0, 1},
		{"k2", "gpt-4o", "USD", 1, 500, 0.0022, 0},
		{"k2", "mystery", "", 1, 200, 0, 1},
	})
	check(build("ny", ByUser, week), []want{
		{"", "gpt-4o", "USD", 1, 0, 0, 0},
		{"u1", "gpt-4o", "USD", 2, 2500, 0.0122, 0},
		{"u1", "mystery", "", 1, 30, 0, 1},
		{"u2", "gpt-4o", "USD", 1, 1000, 0.005, 0},
		{"u2", "mystery", "", 1, 200, 0, 1},
	})
	check(build("ny", BySession, week), []want{
		{"", "gpt-4o", "USD", 1, 0, 0, 0},
		{"", "mystery", "", 1, 200, 0, 1},
		{"s1", "gpt-4o", "USD", 1, 2000, 0.010, 0},
		{"s1", "mystery", "", 1, 30, 0, 1},
		{"s2", "gpt-4o", "USD", 1, 1000, 0.005, 0},
		{"s3", "gpt-4o", "USD", 1, 500, 0.0022, 0},
	})
	// New York's Nov 1 has 25 hours: 11-01T04:00Z .. 11-02T05:00Z.
	day := build("ny", ByTenant, Period{Kind: "day", At: "2026-11-01"})
	if day.End.Sub(day.Start) != 25*time.Hour {
		t.Errorf("New York's Nov 1 lasts %s, want 25h", day.End.Sub(day.Start))
	}
	check(day, []want{{"", "gpt-4o", "USD", 1, 1000, 0.005, 0}, {"", "mystery", "", 1, 200, 0, 1}})
	if len(byKey.Totals) != 2 || byKey.Totals[0].Currency != "" || byKey.Totals[0].UnpricedRequests != 2 ||
		byKey.Totals[1].Requests != 4 || !near(byKey.Totals[1].Cost, 0.0172) {
		t.Errorf("New York's week totals %+v, want 2 unpriced requests and USD 4 requests costing 0.0172", byKey.Totals)
	}

	org := Organization("corp", []*Report{build("ny", ByTenant, week), build("acme", ByTenant, week)})
	check(org, []want{{"", "gpt-4o", "USD", 5, 5500, 0.0212, 0}, {"", "mystery", "", 2, 230, 0, 2}})
	if strings.Join(org.Tenants, ",") != "ny,acme" || org.Zone != "America/New_York, Asia/Shanghai" ||
		org.Start.UTC() != utc("2026-10-25T16:00:00Z") || org.End.UTC() != utc("2026-11-02T05:00:00Z") {
		t.Errorf("corp's report: tenants %v, zones %q, %s .. %s", org.Tenants, org.Zone, org.Start.UTC(), org.End.UTC())
	}

	// docs/finance.md's query per key gives the report's lines.
	rows, err := conn.Query(ctx, `
SELECT api_key_id, model, currency, count() AS requests, sum(total_tokens) AS tokens,
       round(sum(cost), 6) AS cost, countIf(priced = 0) AS unpriced
FROM usage_priced
WHERE tenant = 'ny'
  AND toMonday(toDate(time, 'America/New_York')) = toDate('2026-10-26')
GROUP BY api_key_id, model, currency
ORDER BY api_key_id, model, currency`)
	if err != nil {
		t.Fatal(err)
	}
	var fromSQL []Line
	for rows.Next() {
		var l Line
		if err := rows.Scan(&l.Group, &l.Model, &l.Currency, &l.Requests, &l.TotalTokens, &l.Cost, &l.UnpricedRequests); err != nil {
			t.Fatal(err)
		}
		fromSQL = append(fromSQL, l)
	}
	rows.Close()
	for i, l := range byKey.Lines {
		if len(fromSQL) != len(byKey.Lines) || fromSQL[i].Group != l.Group || fromSQL[i].Requests != l.Requests || fromSQL[i].TotalTokens != l.TotalTokens ||
			!near(fromSQL[i].Cost, l.Cost) || fromSQL[i].UnpricedRequests != l.UnpricedRequests {
			t.Fatalf("docs/finance.md's query per key: %+v, want the report's %+v", fromSQL, byKey.Lines)
		}
	}

	// Each format shows the level and the unpriced lines as such.
	var tbl, out bytes.Buffer
	if err := Write(&tbl, "table", []*Report{byKey, org}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"tenant ny by key, week from 2026-10-26 (America/New_York)",
		"organization corp (ny, acme), week from 2026-10-26 (America/New_York, Asia/Shanghai)", " KEY "} {
		if !strings.Contains(tbl.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, tbl.String())
		}
	}
	var k2Mystery bool
	for _, l := range strings.Split(tbl.String(), "\n") {
		f := strings.Fields(l)
		k2Mystery = k2Mystery || len(f) > 3 && f[0] == "k2" && f[1] == "mystery" && f[2] == "(unpriced)" && slices.Contains(f, "unpriced")
	}
	if !k2Mystery {
		t.Errorf("table lacks k2's unpriced mystery line:\n%s", tbl.String())
	}
	if err := Write(&out, "csv", []*Report{byKey}); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	if r := recs[5]; r[col["group"]] != "k2" || r[col["model"]] != "mystery" || r[col["cost"]] != "" || r[col["by"]] != "key" ||
		r[col["period_kind"]] != "week" || r[col["month"]] != "2026-10-26" {
		t.Errorf("csv row of k2's mystery usage: %v (header %v)", r, recs[0])
	}

	if _, err := Build(ctx, conn, pol.Tenant("ny"), "team", week); err == nil || !strings.Contains(err.Error(), "tenant, key, user, session") {
		t.Errorf("a report by team: %v, want the levels named", err)
	}
	for p, msg := range map[Period]string{
		{Kind: "year", At: "2026"}:        `period: "year" is not one of month, week, day`,
		{Kind: "week", At: "2026-10"}:     `date "2026-10": want YYYY-MM-DD`,
		{Kind: "month", At: "2026-10-28"}: `month "2026-10-28": want YYYY-MM`,
		{Kind: "day", At: "yesterday"}:    `date "yesterday"`,
		{Kind: "month", At: "2026-10"}:    "",
		{Kind: "week", At: "2026-10-28"}:  "",
	} {
		if err := p.Validate(); (msg == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), msg) {
			t.Errorf("%+v: %v, want %q", p, err, msg)
		}
	}
}

package report

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/policy"
)

// The catalog is left out: the figures are the fixture's own prices.
const fixturePolicy = `
price_catalog: none
tenants:
  acme:
    timezone: Asia/Shanghai
    models:
      gpt-4o: {monthly_tokens: 2000000, mode: soft}
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
  - {model: gpt-4o, currency: USD, effective_from: 2026-11-15T00:00:00Z, prompt: 2, completion: 8, cached: 1}
  - {model: claude-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 3, completion: 15, cached: 0.3}
`

type ev struct {
	tenant, id, at, model string
	p, c, cached          uint64
	offset                int64
	estimated             uint8
	ingested              string
	// key, user and session: the levels below the tenant (levels_test.go).
	key, user, session string
}

// insertEvents writes evs into usage_events, each ingested a second after
// its time unless it says when.
func insertEvents(t testing.TB, conn driver.Conn, evs []ev) {
	t.Helper()
	ctx := context.Background()
	b, err := conn.PrepareBatch(ctx, `INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens,
cached_tokens, outcome, estimated, kafka_partition, kafka_offset, ingested_at, api_key_id, user, session_id)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		ing := utc(e.at).Add(time.Second)
		if e.ingested != "" {
			ing = utc(e.ingested)
		}
		if err := b.Append(e.id, utc(e.at), e.tenant, e.model, e.p, e.c, e.cached, "ok", e.estimated, int32(0), e.offset, ing,
			e.key, e.user, e.session); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// The November 2026 fixture. acme's month is Shanghai's: [10-31T16:00Z,
// 11-30T16:00Z). gpt-4o's price changes at 11-15T00:00Z.
var fixture = []ev{
	{"acme", "a1", "2026-10-31T17:00:00Z", "gpt-4o", 1000, 1000, 0, 1, 0, "", "", "", ""},                    // Nov 1 in Shanghai; old price: 0.0125
	{"acme", "a2", "2026-11-14T23:59:59Z", "gpt-4o", 2000, 500, 1000, 2, 0, "", "", "", ""},                  // last second of the old price: 0.00875
	{"acme", "a3", "2026-11-15T00:00:00Z", "gpt-4o", 2000, 500, 1000, 3, 0, "", "", "", ""},                  // first second of the new price: 0.007
	{"acme", "a3", "2026-11-15T00:00:00Z", "gpt-4o", 2000, 500, 1000, 9, 0, "", "", "", ""},                  // a retry of a3
	{"acme", "a4", "2026-11-20T10:00:00Z", "gpt-4o", 100, 100, 0, 12, 0, "2026-12-05T00:00:00Z", "", "", ""}, // late: arrived in December; 0.001
	{"acme", "a5", "2026-11-10T00:00:00Z", "claude-x", 10000, 2000, 5000, 4, 0, "", "", "", ""},              // 0.0465
	{"acme", "a6", "2026-11-11T00:00:00Z", "claude-x", 100, 100, 0, 10, 1, "", "", "", ""},                   // estimate ...
	{"acme", "a6", "2026-11-11T00:00:00Z", "claude-x", 300, 200, 0, 11, 0, "", "", "", ""},                   // ... settled: 0.0039
	{"acme", "a7", "2026-11-05T00:00:00Z", "mystery", 50, 50, 0, 5, 0, "", "", "", ""},                       // no price
	{"acme", "x1", "2026-10-31T15:59:59Z", "gpt-4o", 1000000, 0, 0, 6, 0, "", "", "", ""},                    // Oct 31 in Shanghai
	{"acme", "x2", "2026-11-30T16:00:00Z", "gpt-4o", 1000000, 0, 0, 7, 0, "", "", "", ""},                    // Dec 1 in Shanghai
	{"beta", "b1", "2026-11-03T00:00:00Z", "gpt-4o", 1000, 0, 0, 1, 0, "", "", "", ""},                       // 0.0025
	{"beta", "b0", "2026-10-31T17:00:00Z", "gpt-4o", 1000, 0, 0, 2, 0, "", "", "", ""},                       // October in UTC
}

func setup(t testing.TB) (driver.Conn, *policy.Policy) {
	t.Helper()
	ctx := context.Background()
	_, conn := migrationtest.Open(t)
	pol, err := policy.Parse([]byte(fixturePolicy), "fixture.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now()); err != nil || n != 3 {
		t.Fatalf("price sync wrote %d rows, %v; want 3", n, err)
	}
	if n, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now()); err != nil || n != 0 {
		t.Fatalf("second price sync wrote %d rows, %v; want 0", n, err)
	}
	insertEvents(t, conn, fixture)
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	nov := time.Date(2026, 11, 1, 0, 0, 0, 0, shanghai)
	q, err := conn.PrepareBatch(ctx, `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used,
quota_limit, unit, mode, version, updated_at)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		model, quota, period string
		start, end           time.Time
		used, limit          float64
		mode                 string
		version              uint64
	}{
		{"gpt-4o", "monthly_tokens", "month", nov, nov.AddDate(0, 1, 0), 1900000, 2000000, "soft", 1},
		{"gpt-4o", "monthly_tokens", "month", nov, nov.AddDate(0, 1, 0), 2100000, 2000000, "soft", 2},   // the latest: 100,000 over
		{"*", "daily_tokens", "day", nov.AddDate(0, 0, 3), nov.AddDate(0, 0, 4), 600, 500, "hard", 1},   // hard: blocked, not billed
		{"*", "daily_tokens", "day", nov.AddDate(0, 0, -3), nov.AddDate(0, 0, -2), 900, 500, "soft", 1}, // October
	} {
		if err := q.Append("acme", r.model, r.quota, r.period, r.start, r.end, r.used, r.limit, "tokens", r.mode, r.version, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Send(); err != nil {
		t.Fatal(err)
	}
	return conn, pol
}

var november = Period{Kind: "month", At: "2026-11"}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestMonthlyReportMatchesHandTotals(t *testing.T) {
	conn, pol := setup(t)
	ctx := context.Background()
	m, err := Build(ctx, conn, pol.Tenant("acme"), ByTenant, november)
	if err != nil {
		t.Fatal(err)
	}
	want := []Line{
		{Model: "claude-x", Currency: "USD", Requests: 2, PromptTokens: 10300, CompletionTokens: 2200, CachedTokens: 5000, TotalTokens: 12500, Cost: 0.0504},
		{Model: "gpt-4o", Currency: "USD", Requests: 4, PromptTokens: 5100, CompletionTokens: 2100, CachedTokens: 2000, TotalTokens: 7200, Cost: 0.02925},
		{Model: "mystery", Currency: "", Requests: 1, PromptTokens: 50, CompletionTokens: 50, TotalTokens: 100, UnpricedRequests: 1},
	}
	if len(m.Lines) != len(want) {
		t.Fatalf("lines %+v, want %+v", m.Lines, want)
	}
	for i, w := range want {
		g := m.Lines[i]
		gc, wc := g.Cost, w.Cost
		g.Cost, w.Cost = 0, 0
		if g != w || !near(gc, wc) {
			g.Cost = gc
			w.Cost = wc
			t.Errorf("line %d = %+v, want %+v", i, g, w)
		}
	}
	if len(m.Totals) != 2 || m.Totals[1].Currency != "USD" || m.Totals[1].Requests != 6 || !near(m.Totals[1].Cost, 0.07965) {
		t.Errorf("totals %+v, want USD 6 requests cost 0.07965 and the unpriced line", m.Totals)
	}
	if len(m.Overages) != 1 || m.Overages[0].Overage != 100000 || m.Overages[0].Model != "gpt-4o" || m.Overages[0].Quota != "monthly_tokens" {
		t.Errorf("overages %+v, want gpt-4o monthly_tokens 100000 over (latest version only, soft only, November only)", m.Overages)
	}
	if !m.Start.Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, pol.Tenant("acme").Location)) || m.Zone != "Asia/Shanghai" {
		t.Errorf("month starts %v", m.Start)
	}

	// The same report in each format carries the same figures.
	var tbl, csvOut, jsonOut bytes.Buffer
	for f, w := range map[string]*bytes.Buffer{"table": &tbl, "csv": &csvOut, "json": &jsonOut} {
		if err := Write(w, f, []*Report{m}); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if !strings.Contains(tbl.String(), "0.029250") || !strings.Contains(tbl.String(), "100000") {
		t.Errorf("table lacks the gpt-4o cost or the overage:\n%s", tbl.String())
	}
	// Unpriced usage is a line of its own whose cost says so, not a 0.
	var mysteryLine string
	for _, l := range strings.Split(tbl.String(), "\n") {
		if strings.Contains(l, "mystery") {
			mysteryLine = l
		}
	}
	if !strings.Contains(mysteryLine, "(unpriced)") || !strings.Contains(mysteryLine, "unpriced ") || strings.Contains(mysteryLine, "0.000000") {
		t.Errorf("table's mystery line %q: want currency (unpriced) and cost unpriced, not 0.000000", mysteryLine)
	}
	recs, err := csv.NewReader(&csvOut).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	costCol, unpricedCol := col["cost"], col["unpriced_requests"]
	var found bool
	for _, r := range recs[1:] {
		if r[3] == "total" && r[5] == "USD" {
			found = r[6] == "6" && r[costCol] == "0.07965"
		}
		if r[4] == "mystery" && (r[5] != "" || r[costCol] != "" || r[unpricedCol] != "1") {
			t.Errorf("csv mystery row %v: want no currency, an empty cost and 1 unpriced request", r)
		}
	}
	if !found {
		t.Errorf("csv has no USD total of 6 requests costing 0.07965:\n%s", csvOut.String())
	}
	var back []Report
	if err := json.Unmarshal(jsonOut.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != 1 || back[0].Lines[1].TotalTokens != 7200 || back[0].Overages[0].Overage != 100000 {
		t.Errorf("json round trip lost figures: %+v", back)
	}
	if err := Write(io.Discard, "xml", nil); err == nil || !strings.Contains(err.Error(), "table, csv, json") {
		t.Errorf("unknown format error = %v, want the accepted formats named", err)
	}
}

func TestExportListsEveryTenantWithItsOwnMonth(t *testing.T) {
	conn, pol := setup(t)
	ctx := context.Background()
	start, end, _ := november.Bounds(&policy.Tenant{})
	tenants, err := Tenants(ctx, conn, start, end)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(tenants, ",") != "acme,beta" {
		t.Fatalf("tenants %v, want acme,beta", tenants)
	}
	m, err := Build(ctx, conn, pol.Tenant("beta"), ByTenant, november)
	if err != nil {
		t.Fatal(err)
	}
	// beta has no zone in the policy: UTC, where b0 is still October.
	if len(m.Lines) != 1 || m.Lines[0].Requests != 1 || !near(m.Lines[0].Cost, 0.0025) {
		t.Errorf("beta lines %+v, want one gpt-4o request costing 0.0025", m.Lines)
	}
}

// TestViewsMatchHandTotals checks the SQL views finance queries directly.
func TestViewsMatchHandTotals(t *testing.T) {
	conn, _ := setup(t)
	ctx := context.Background()
	var (
		requests uint64
		cost     float64
	)
	// usage_monthly is by UTC month: for beta that is its own calendar.
	if err := conn.QueryRow(ctx, `SELECT sum(requests), sum(cost) FROM usage_monthly WHERE tenant = 'beta' AND month = toDate('2026-11-01')`).Scan(&requests, &cost); err != nil {
		t.Fatal(err)
	}
	if requests != 1 || !near(cost, 0.0025) {
		t.Errorf("usage_monthly beta November: %d requests, cost %v; want 1 and 0.0025", requests, cost)
	}
	// usage_daily around the price change: the day of 11-15 UTC is all new price.
	if err := conn.QueryRow(ctx, `SELECT sum(requests), sum(cost) FROM usage_daily WHERE tenant = 'acme' AND model = 'gpt-4o' AND day = toDate('2026-11-15')`).Scan(&requests, &cost); err != nil {
		t.Fatal(err)
	}
	if requests != 1 || !near(cost, 0.007) {
		t.Errorf("usage_daily acme gpt-4o 11-15: %d requests, cost %v; want 1 (a3 once) and 0.007", requests, cost)
	}
	var overage float64
	if err := conn.QueryRow(ctx, `SELECT sum(overage) FROM soft_quota_overage WHERE tenant = 'acme'`).Scan(&overage); err != nil {
		t.Fatal(err)
	}
	if overage != 100000+400 {
		t.Errorf("soft_quota_overage total %v, want 100400 (November's monthly and October's soft daily)", overage)
	}
}

// TestTokenTypesPricedApart: the report, usage_daily and usage_monthly
// carry cache reads, cache writes and reasoning tokens, and an event with
// every token type costs exactly each type times its own price: the
// policy's, or input and output where the entry leaves cache writes and
// reasoning out.
func TestTokenTypesPricedApart(t *testing.T) {
	ctx := context.Background()
	_, conn := migrationtest.Open(t)
	pol, err := policy.Parse([]byte(`
price_catalog: none
prices:
  - {model: claude-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 3, completion: 15, cached: 0.3, cache_write: 3.75, reasoning: 20}
  - {model: o-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2, completion: 8, cached: 0.5}
`), "types.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now()); err != nil {
		t.Fatal(err)
	}
	b, err := conn.PrepareBatch(ctx, `INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens,
cached_tokens, cache_write_tokens, reasoning_tokens, outcome, estimated, kafka_partition, kafka_offset, ingested_at)`)
	if err != nil {
		t.Fatal(err)
	}
	at := utc("2026-11-10T10:00:00Z")
	// 1,000 plain input, 2,000 cache reads, 3,000 cache writes, 4,000
	// plain output, 5,000 reasoning.
	for i, model := range []string{"claude-x", "o-x"} {
		if err := b.Append(fmt.Sprint("t", i), at, "types", model, uint64(6000), uint64(9000), uint64(2000), uint64(3000), uint64(5000),
			"ok", uint8(0), int32(0), int64(i+1), at); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"claude-x": (1000*3 + 2000*0.3 + 3000*3.75 + 4000*15 + 5000*20) / 1e6,
		"o-x":      (1000*2 + 2000*0.5 + 3000*2 + 4000*8 + 5000*8) / 1e6,
	}
	m, err := Build(ctx, conn, &policy.Tenant{ID: "types"}, ByTenant, november)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Lines) != 2 {
		t.Fatalf("report lines %+v, want one per model", m.Lines)
	}
	for _, l := range m.Lines {
		if l.CachedTokens != 2000 || l.CacheWriteTokens != 3000 || l.ReasoningTokens != 5000 || l.TotalTokens != 15000 || !near(l.Cost, want[l.Model]) {
			t.Errorf("report line %+v: want 2000 cached, 3000 cache-write, 5000 reasoning, 15000 total tokens, cost %v", l, want[l.Model])
		}
	}
	if tot := m.Totals[0]; tot.CacheWriteTokens != 6000 || tot.ReasoningTokens != 10000 {
		t.Errorf("report total %+v: want 6000 cache-write and 10000 reasoning tokens", tot)
	}
	for _, view := range []string{"usage_daily", "usage_monthly"} {
		for model, cost := range want {
			var (
				cached, write, reasoning uint64
				got                      float64
			)
			if err := conn.QueryRow(ctx, `SELECT toUInt64(sum(cached_tokens)), toUInt64(sum(cache_write_tokens)), toUInt64(sum(reasoning_tokens)), sum(cost)
FROM `+view+` WHERE tenant = 'types' AND model = ?`, model).Scan(&cached, &write, &reasoning, &got); err != nil {
				t.Fatal(err)
			}
			if cached != 2000 || write != 3000 || reasoning != 5000 || !near(got, cost) {
				t.Errorf("%s %s: cached %d, cache-write %d, reasoning %d, cost %v; want 2000, 3000, 5000, %v", view, model, cached, write, reasoning, got, cost)
			}
		}
	}
}

// TestMonthIsTheTenantsBillingMonth: -month 2026-02 of a tenant billed
// from the 20th is its month from February 20th, in its zone, as its
// quotas and limits count it; of a calendar tenant, February.
func TestMonthIsTheTenantsBillingMonth(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	for _, tc := range []struct {
		billingDay int
		start, end time.Time
	}{
		{20, time.Date(2026, 2, 20, 0, 0, 0, 0, ny), time.Date(2026, 3, 20, 0, 0, 0, 0, ny)},
		{1, time.Date(2026, 2, 1, 0, 0, 0, 0, ny), time.Date(2026, 3, 1, 0, 0, 0, 0, ny)},
	} {
		start, end, err := Period{Kind: "month", At: "2026-02"}.Bounds(&policy.Tenant{Location: ny, BillingDay: tc.billingDay})
		if err != nil || !start.Equal(tc.start) || !end.Equal(tc.end) {
			t.Errorf("billing day %d: %v .. %v (%v); want %v .. %v", tc.billingDay, start, end, err, tc.start, tc.end)
		}
	}
}

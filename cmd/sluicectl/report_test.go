package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/reconciler/report"
)

// TestReportFlagsNameWhatTheyAccept: -by and -period take the levels and
// period kinds, a month is named by -month and a week or day by -date,
// and every mistake is refused naming the flag and what it accepts; the
// defaults are today's report (a tenant's month).
func TestReportFlagsNameWhatTheyAccept(t *testing.T) {
	cfg, err := loadReportConfig("report", "table", []string{"-month", "2026-11", "-tenant", "acme"})
	if err != nil || cfg.By != "tenant" || cfg.period().Kind != "month" || cfg.period().At != "2026-11" {
		t.Fatalf("defaults: %+v, %v; want by tenant, month 2026-11", cfg, err)
	}
	if cfg, err := loadReportConfig("report", "table", []string{"-by", "session", "-period", "week", "-date", "2026-11-30", "-tenant", "acme"}); err != nil ||
		cfg.period().At != "2026-11-30" {
		t.Fatalf("a week by session: %+v, %v", cfg, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-month", "2026-11", "-by", "team"}, `by: "team" is not one of organization, tenant, key, user, session`},
		{[]string{"-period", "year"}, `period: "year" is not one of month, week, day`},
		{[]string{"-period", "week"}, "date: is required with -period week, as YYYY-MM-DD"},
		{[]string{"-period", "day", "-date", "2026-11-31"}, `date "2026-11-31": want YYYY-MM-DD`},
		{[]string{"-period", "day", "-date", "2026-11-30", "-month", "2026-11"}, "month: names a month (-period month)"},
		{[]string{"-month", "2026-11", "-date", "2026-11-30"}, "date: names a week or a day"},
		{[]string{}, "month: is required with -period month"},
	} {
		if _, err := loadReportConfig("export", "csv", c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestReportByOrganizationAndExportByKey: `sluicectl report -by
// organization` sums the teams the policy puts in the organisation (each
// team's month in its own zone) and nothing else, and `sluicectl export
// -by key` lists every tenant's keys, unpriced usage on its own line.
func TestReportByOrganizationAndExportByKey(t *testing.T) {
	ctx := context.Background()
	ch, conn := migrationtest.Open(t)
	dir := t.TempDir()
	polFile := filepath.Join(dir, "policy.yaml")
	polText := `
price_catalog: none
tenants:
  acme: {timezone: Asia/Shanghai, organization: corp}
  trial: {organization: corp}
  solo: {}
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2, completion: 8}
`
	if err := os.WriteFile(polFile, []byte(polText), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte(polText), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now()); err != nil {
		t.Fatal(err)
	}
	// acme's November starts at 10-31T16:00Z: a0 is in it, trial's
	// (UTC) does not have t0. solo is no part of corp.
	b, err := conn.PrepareBatch(ctx, "INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, api_key_id, kafka_offset)")
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range []struct {
		id, at, tenant, model string
		p, c                  uint64
		key                   string
	}{
		{"a0", "2026-10-31T17:00:00Z", "acme", "gpt-4o", 1000, 0, "k1"},
		{"a1", "2026-11-10T00:00:00Z", "acme", "mystery", 10, 10, "k2"},
		{"t0", "2026-10-31T17:00:00Z", "trial", "gpt-4o", 5000, 0, "k9"},
		{"t1", "2026-11-20T00:00:00Z", "trial", "gpt-4o", 0, 1000, "k9"},
		{"s1", "2026-11-20T00:00:00Z", "solo", "gpt-4o", 100000, 0, "k1"},
	} {
		at, _ := time.Parse(time.RFC3339, e.at)
		if err := b.Append(e.id, at, e.tenant, e.model, e.p, e.c, e.key, int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	common := []string{"-policy.file", polFile, "-clickhouse.addr", ch.Addr, "-clickhouse.database", ch.Database, "-month", "2026-11"}

	out := filepath.Join(dir, "corp.json")
	if err := runReport(ctx, append(common, "-by", "organization", "-organization", "corp", "-format", "json", "-out", out)); err != nil {
		t.Fatal(err)
	}
	var reports []report.Report
	if b, err := os.ReadFile(out); err != nil || json.Unmarshal(b, &reports) != nil {
		t.Fatalf("corp's report: %s, %v", b, err)
	}
	if len(reports) != 1 || strings.Join(reports[0].Tenants, ",") != "acme,trial" || len(reports[0].Lines) != 2 {
		t.Fatalf("corp's report %+v, want acme and trial, a gpt-4o and a mystery line", reports)
	}
	if g, m := reports[0].Lines[0], reports[0].Lines[1]; g.Model != "gpt-4o" || g.Requests != 2 || math.Abs(g.Cost-0.010) > 1e-12 ||
		m.Model != "mystery" || m.Currency != "" || m.UnpricedRequests != 1 {
		t.Errorf("corp's lines %+v, want gpt-4o a0 and t1 ($0.010) and mystery unpriced", reports[0].Lines)
	}

	out = filepath.Join(dir, "keys.csv")
	if err := runExport(ctx, append(common, "-by", "key", "-out", out)); err != nil {
		t.Fatal(err)
	}
	exported, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(bytes.NewReader(exported)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, r := range recs[1:] {
		if r[3] == "usage" {
			rows = append(rows, r[0]+"/"+r[len(r)-1]+"/"+r[4]+"/"+r[6])
		}
	}
	if got := strings.Join(rows, " "); got != "acme/k1/gpt-4o/1 acme/k2/mystery/1 solo/k1/gpt-4o/1 trial/k9/gpt-4o/1" {
		t.Errorf("export by key: %s; want tenant/key/model/requests per key", got)
	}
}

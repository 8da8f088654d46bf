package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations/migrationtest"
)

// TestPredictionsListsEachQuotasExhaustionWithItsRange reads the
// aggregator's quota_state as the console does: a runaway predicted to
// run out in about a minute on the early rates, acme later on its
// forecast with an open end, trial without a prediction. The table lists
// the soonest first with range and basis and leaves trial out unless
// -all; -tenant narrows; json carries the usage API's fields.
func TestPredictionsListsEachQuotasExhaustionWithItsRange(t *testing.T) {
	ctx := context.Background()
	ch, conn := migrationtest.Open(t)
	now := time.Now().UTC().Truncate(time.Second)
	hour, day := now.Truncate(time.Hour), now.Truncate(24*time.Hour)
	b, err := conn.PrepareBatch(ctx, `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used, quota_limit,
 unit, mode, tier, rate_per_minute, predicted_exhaustion, predicted_earliest, predicted_latest, prediction_basis, version, updated_at)`)
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Unix(0, 0)
	for _, r := range []struct {
		tenant, quota, period string
		start, end            time.Time
		used, limit           float64
		exh, lo, hi           time.Time
		basis                 string
	}{
		{"runaway", "hourly_tokens", "hour", hour, hour.Add(time.Hour), 100000, 500000, now.Add(65 * time.Second), now.Add(50 * time.Second), now.Add(100 * time.Second), "rates"},
		{"acme", "daily_tokens", "day", day, day.Add(24 * time.Hour), 1000000, 2000000, now.Add(3 * time.Hour), now.Add(2 * time.Hour), epoch, "forecast"},
		{"trial", "hourly_tokens", "hour", hour, hour.Add(time.Hour), 10, 100000, epoch, epoch, epoch, ""},
	} {
		if err := b.Append(r.tenant, "*", r.quota, r.period, r.start, r.end, r.used, r.limit, "tokens", "hard", uint16(0), 1000.0,
			r.exh, r.lo, r.hi, r.basis, uint64(1), now); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("tenants:\n  trial:\n    models:\n      \"*\": {hourly_tokens: 100000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		args = append([]string{"-clickhouse.addr", ch.Addr, "-clickhouse.database", ch.Database, "-policy.file", pol}, args...)
		if err := runPredictionsTo(ctx, args, &out); err != nil {
			t.Fatalf("predictions %v: %v", args, err)
		}
		return out.String()
	}

	table := run()
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "runaway") || !strings.HasPrefix(lines[2], "acme") {
		t.Fatalf("want the runaway, then acme, and not trial:\n%s", table)
	}
	// The range is relative to the command's clock, a second or so after
	// the rows were written.
	if !regexp.MustCompile(`in 1m[0-5]s \((4[5-9]|50)s-1m(3[5-9]|40)s\) rates`).MatchString(lines[1]) {
		t.Errorf("runaway's line lacks its prediction in about 1m5s with its range 50s-1m40s and basis: %s", lines[1])
	}
	for _, want := range []string{"hourly_tokens/hour", "20.0%", now.Add(65 * time.Second).Format("15:04:05")} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("runaway's line lacks %q: %s", want, lines[1])
		}
	}
	if !strings.Contains(lines[2], "(2h0m-) forecast") {
		t.Errorf("acme's line lacks its open range and basis: %s", lines[2])
	}
	if all := run("-all"); !strings.Contains(all, "trial") || strings.Index(all, "trial") < strings.Index(all, "acme") {
		t.Errorf("-all lists trial last:\n%s", all)
	}
	if one := run("-tenant", "acme"); strings.Contains(one, "runaway") || !strings.Contains(one, "acme") {
		t.Errorf("-tenant acme:\n%s", one)
	}
	var js []map[string]any
	if err := json.Unmarshal([]byte(run("-format", "json")), &js); err != nil {
		t.Fatal(err)
	}
	if len(js) != 2 || js[0]["tenant"] != "runaway" || js[0]["prediction_basis"] != "rates" || js[0]["predicted_earliest"] == nil ||
		js[1]["predicted_latest"] != nil {
		t.Errorf("json: %v", js)
	}
	var out bytes.Buffer
	if err := runPredictionsTo(ctx, []string{"-format", "yaml"}, &out); err == nil || !strings.Contains(err.Error(), "format") {
		t.Errorf("-format yaml: %v, want an error naming format", err)
	}
}

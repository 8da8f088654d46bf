package migrations_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestApplyTwiceOnClickHouse18 applies every migration to the real
// ClickHouse (18.16 from Debian in CI) and then again: the second run must
// apply nothing and leave the tables as they were.
func TestApplyTwiceOnClickHouse18(t *testing.T) {
	cfg := itest.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := chconn.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	tables := func() string {
		var b strings.Builder
		e := engines(t, conn, cfg.Database)
		for _, n := range slices.Sorted(maps.Keys(e)) {
			b.WriteString(n + ":" + e[n] + " ")
		}
		return b.String()
	}
	var before string
	all := applyTwice(t, func() ([]int, error) { return migrations.Apply(ctx, conn, quiet) }, func() {
		before = tables()
		for _, want := range []string{"usage_events:ReplacingMergeTree", "usage_minute:", "quota_state:", "tier_transitions:",
			"signals_log:", "admin_audit:MergeTree", "reconciliation_runs:", "prices:", "schema_migrations:"} {
			if !strings.Contains(before, want) {
				t.Errorf("table %s missing after migrate; have %s", want, before)
			}
		}
	})
	if after := tables(); after != before {
		t.Fatalf("second run changed tables:\nbefore %s\nafter  %s", before, after)
	}
	applied, err := migrations.Applied(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(all) {
		t.Fatalf("schema_migrations records %d versions, want %d", len(applied), len(all))
	}
}

// applyTwice applies every migration through apply, then, after between,
// again: the first run must apply them all, the second nothing. It returns
// the migrations.
func applyTwice(t *testing.T, apply func() ([]int, error), between func()) []migrations.Migration {
	t.Helper()
	all, err := migrations.Load()
	if err != nil {
		t.Fatal(err)
	}
	first, err := apply()
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != len(all) {
		t.Fatalf("first run applied %v, want all %d migrations", first, len(all))
	}
	between()
	if again, err := apply(); err != nil || len(again) != 0 {
		t.Fatalf("second run applied %v, %v; want nothing", again, err)
	}
	return all
}

// TestChangedMigrationIsRefused: editing an applied file must stop the
// migrator with an error naming the file, not silently diverge.
func TestChangedMigrationIsRefused(t *testing.T) {
	cfg := itest.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := chconn.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := migrations.Apply(ctx, conn, quiet); err != nil {
		t.Fatal(err)
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, checksum, applied_at)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append(uint32(1), "usage_events", strings.Repeat("0", 64), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	_, err = migrations.Apply(ctx, conn, quiet)
	if err == nil || !strings.Contains(err.Error(), "001_usage_events changed after it was applied") {
		t.Fatalf("Apply = %v, want a refusal naming 001_usage_events", err)
	}
}

// TestMigrationsRunOnCurrentClickHouse runs every file through chdb, an
// embedded current ClickHouse, twice. The Python interpreter with chdb comes
// from `make chdb` (.services/venv) or SLUICE_CHDB_PYTHON.
func TestMigrationsRunOnCurrentClickHouse(t *testing.T) {
	out, err := exec.Command(chdbPython(t), "chdb_check.py", "sql").CombinedOutput()
	if err != nil {
		t.Fatalf("chdb check failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func TestSplitStatements(t *testing.T) {
	got := migrations.SplitStatements("-- c\nCREATE TABLE a (x UInt8)\nENGINE = Memory;\n\n-- d\nCREATE TABLE b (y UInt8) ENGINE = Memory;\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], "CREATE TABLE a") || strings.HasSuffix(got[1], ";") {
		t.Fatalf("SplitStatements = %q", got)
	}
}

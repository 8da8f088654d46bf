package migrations_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/migrations/migrationtest"
)

// TestAddColumnRunsAgainOnClickHouse18: migrations interrupted after
// their statements ran, before they were recorded, run again — those
// adding columns included, on 18.16, which has no ADD COLUMN IF NOT
// EXISTS. Here every migration is in that state: the schema is all there,
// the record of it is gone.
func TestAddColumnRunsAgainOnClickHouse18(t *testing.T) {
	_, conn := migrationtest.Open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all, err := migrations.Load()
	if err != nil {
		t.Fatal(err)
	}
	addColumn := regexp.MustCompile(`(?i)\bADD\s+COLUMN\b`)
	adds := 0
	for _, m := range all {
		for _, st := range m.Statements {
			if addColumn.MatchString(st) {
				adds++
			}
		}
	}
	if adds == 0 {
		t.Fatal("no migration adds a column: nothing checked")
	}
	if err := conn.Exec(ctx, "DROP TABLE schema_migrations"); err != nil {
		t.Fatal(err)
	}
	again, err := migrations.Apply(ctx, conn, quiet)
	if err != nil {
		t.Fatalf("migrations run again: %v", err)
	}
	if len(again) != len(all) {
		t.Fatalf("run again: applied %v, want all %d migrations", again, len(all))
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'quota_state' AND name LIKE 'predict%'").Scan(&n); err != nil || n != 4 {
		t.Fatalf("quota_state has %d predict* columns (%v), want 4", n, err)
	}
}

package migrations

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
)

// TestAddColumnRunsAgainOnClickHouse18: a migration adding columns that
// was interrupted after its ALTERs (so it is not recorded) runs again on
// 18.16, which has no ADD COLUMN IF NOT EXISTS.
func TestAddColumnRunsAgainOnClickHouse18(t *testing.T) {
	cfg := itest.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := chconn.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := Apply(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	all, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	adds := 0
	for _, m := range all {
		for _, st := range m.Statements {
			if _, _, ok := addedColumn(st); ok {
				adds++
				if err := execIdempotent(ctx, conn, st); err != nil {
					t.Errorf("%03d_%s run again: %v", m.Version, m.Name, err)
				}
			}
		}
	}
	if adds == 0 {
		t.Fatal("no migration adds a column: nothing checked")
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'quota_state' AND name LIKE 'predict%'").Scan(&n); err != nil || n != 4 {
		t.Fatalf("quota_state has %d predict* columns (%v), want 4", n, err)
	}
}

// TestLoadRefusesAddColumnsApplyCannotRepeat: several columns in one
// ALTER, or IF NOT EXISTS (a syntax error on 18.16), are refused at load
// with the form to use.
func TestLoadRefusesAddColumnsApplyCannotRepeat(t *testing.T) {
	for _, sql := range []string{
		"ALTER TABLE t ADD COLUMN a UInt8, ADD COLUMN b UInt8;",
		"ALTER TABLE t ADD COLUMN IF NOT EXISTS a UInt8;",
	} {
		_, err := load(fstest.MapFS{"001_x.sql": {Data: []byte(sql)}})
		if err == nil || !strings.Contains(err.Error(), "one column per statement") {
			t.Errorf("%s: error %v, want one naming the form to use", sql, err)
		}
	}
	if _, err := load(fstest.MapFS{"001_x.sql": {Data: []byte("ALTER TABLE t ADD COLUMN a UInt8 DEFAULT 0;")}}); err != nil {
		t.Errorf("one column: %v", err)
	}
}

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
)

// TestMigrateCopiesThePolicyPrices: `sluice migrate` with a policy_file
// leaves the prices in ClickHouse, so cost views price usage before any
// service has run (Docker Compose migrates first).
func TestMigrateCopiesThePolicyPrices(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse")
	}
	cfg := sluiceconfig.Defaults()
	cfg.ClickHouse = itest.ClickHouse(t)
	cfg.Log.Level = "warn"
	cfg.Policy.File = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(cfg.Policy.File, []byte("prices:\n  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	conn, err := chconn.Open(ctx, cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM price_periods WHERE model = 'gpt-4o'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("price_periods holds %d gpt-4o periods after migrate, want 1", n)
	}
}

// Package migrationtest gives a test a ClickHouse database of its own with
// every migration applied, against the services of scripts/services.sh
// (see platform/itest): the set-up every test of a ClickHouse reader or
// writer starts with.
package migrationtest

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
)

// Open returns the configuration of a fresh database for t
// (itest.ClickHouse) and a connection to it with every migration applied.
// The connection closes when t ends.
func Open(t testing.TB) (chconn.Config, driver.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := itest.ClickHouse(t)
	conn, err := chconn.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := migrations.Apply(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	return cfg, conn
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/logging"
)

// migrate creates the database if needed and applies pending migrations,
// retrying the connection for a while so `make run` can start ClickHouse and
// Sluice together.
func migrate(ctx context.Context, cfg Config) error {
	log := logging.New(cfg.Log, os.Stderr)
	return applyMigrations(ctx, cfg.ClickHouse, log)
}

func applyMigrations(ctx context.Context, ch chconn.Config, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var lastErr error
	for {
		if lastErr = chconn.EnsureDatabase(ctx, ch); lastErr == nil {
			break
		}
		log.Warn("waiting for ClickHouse", "addr", ch.Addr, "err", lastErr)
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: ClickHouse at %s not reachable: %w", ch.Addr, lastErr)
		case <-time.After(time.Second):
		}
	}
	conn, err := chconn.Open(ctx, ch)
	if err != nil {
		return err
	}
	defer conn.Close()
	applied, err := migrations.Apply(ctx, conn, log)
	if err != nil {
		return err
	}
	log.Info("migrations up to date", "database", ch.Database, "applied_now", len(applied))
	return nil
}

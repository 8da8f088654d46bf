package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/policy"
)

// migrate creates the database if needed and applies pending migrations,
// retrying the connection for a while so `make run` can start ClickHouse and
// Sluice together. With a policy_file it also copies the policy's prices
// into the prices table, so a deployment that migrates first (Docker
// Compose's sluice-migrate) prices usage from its first event; the
// aggregator and the reconciler keep the table in step afterwards.
func migrate(ctx context.Context, cfg sluiceconfig.Config) error {
	log := logging.New(cfg.Log, os.Stderr)
	if err := applyMigrations(ctx, cfg.ClickHouse, log); err != nil {
		return err
	}
	if cfg.Policy.File == "" {
		return nil
	}
	pol, err := policy.Load(cfg.Policy.File)
	if err != nil {
		return fmt.Errorf("migrate: prices from policy.file: %w", err)
	}
	conn, err := chconn.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	n, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now())
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	log.Info("prices table up to date with the policy", "policy_file", cfg.Policy.File, "rows_written", n)
	return nil
}

func applyMigrations(ctx context.Context, ch chconn.Config, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var lastErr error
	for {
		if lastErr = chconn.EnsureDatabase(ctx, ch); lastErr == nil {
			break
		}
		log.Warn("waiting for ClickHouse", "addr", strings.Join(ch.Servers(), ","), "err", lastErr)
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: ClickHouse at %s not reachable: %w", strings.Join(ch.Servers(), ","), lastErr)
		case <-time.After(time.Second):
		}
	}
	// On a cluster (clickhouse.cluster), every server of clickhouse.addrs.
	applied, err := migrations.ApplyConfig(ctx, ch, log)
	if err != nil {
		return err
	}
	log.Info("migrations up to date", "database", ch.Database, "applied_now", len(applied))
	return nil
}

// Package checkertest runs a gateway/checker Checker for the tests and
// benchmarks of the services that ask one before each request (sluice
// gateway, services/authz): on the test's Redis, under a key prefix of its
// own, synced before it is returned and stopped when the test ends.
package checkertest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/gateway/checker"
	"github.com/sluicehq/sluice/platform/itest"
)

// Run starts a Checker with the default configuration on rdb, reading
// the flags under a prefix unique to t (itest.Unique of prefix), and
// returns it once its first sync is done. It stops when t ends.
func Run(t testing.TB, rdb redis.UniversalClient, prefix string) *checker.Checker {
	t.Helper()
	cfg := checker.DefaultConfig()
	cfg.KeyPrefix = itest.Unique(t, prefix) + ":"
	chk, err := checker.New(rdb, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = chk.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	itest.Eventually(t, 30*time.Second, "checker synced", chk.Synced)
	return chk
}

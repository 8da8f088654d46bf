// Package checkertest runs a sdk/go/checker Checker for tests and
// benchmarks on the real Redis — those of the services that ask one before
// each request (sluice gateway, authz), of the enforcer that writes what it
// reads, and the end-to-end ones: synced before it is returned and stopped
// when the test ends.
package checkertest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/checker"
)

// Run starts a Checker with the default configuration on rdb, reading
// the flags under a prefix unique to t (itest.Unique of prefix), and
// returns it once its first sync is done. It stops when t ends.
func Run(t testing.TB, rdb redis.UniversalClient, prefix string) *checker.Checker {
	t.Helper()
	cfg := checker.DefaultConfig()
	cfg.KeyPrefix = itest.Unique(t, prefix) + ":"
	return Start(t, rdb, cfg)
}

// Start starts a Checker with cfg on rdb and returns it once its first
// sync is done (within a minute, generous for a loaded machine, or t
// fails). It stops when t ends; a Run
// that ends with an error fails t.
func Start(t testing.TB, rdb redis.UniversalClient, cfg checker.Config) *checker.Checker {
	t.Helper()
	chk, err := checker.New(rdb, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	itest.Start(t, "checker", chk.Run)
	itest.Eventually(t, time.Minute, "checker synced", chk.Synced)
	return chk
}

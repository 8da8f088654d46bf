package itest

import (
	"context"
	"os"

	"github.com/redis/go-redis/v9"
)

// Only test binaries link itest, so quieting go-redis as the package loads
// spares every test package a TestMain that does nothing else.
func init() { quietRedisLogs() }

// quietRedisLogs drops go-redis's internal log lines (connection teardown
// notices when a test closes its clients), which otherwise land in the
// middle of benchmark result lines. SLUICE_TEST_LOG=1 keeps them.
func quietRedisLogs() {
	if os.Getenv("SLUICE_TEST_LOG") != "1" {
		redis.SetLogger(discard{})
	}
}

type discard struct{}

func (discard) Printf(context.Context, string, ...any) {}

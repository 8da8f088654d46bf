package checker

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// quietRedis drops go-redis's internal log lines, which otherwise land in
// the middle of benchmark result lines (connection teardown notices when a
// test closes its clients).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_LOG") != "1" {
		redis.SetLogger(quietRedis{})
	}
	os.Exit(m.Run())
}

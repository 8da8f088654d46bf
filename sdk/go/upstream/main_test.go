package upstream

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/platform/itest"
)

func TestMain(m *testing.M) {
	itest.QuietRedisLogs()
	os.Exit(m.Run())
}

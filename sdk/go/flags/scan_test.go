package flags_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// UnlinkKeys removes every key of a prefix — more than one pipeline's
// worth, spread over every master of a cluster — and nothing else.
func TestUnlinkKeysRemovesThePrefixOnly(t *testing.T) {
	for name, rc := range map[string]func(testing.TB) redisconn.Config{"redis": itest.Redis, "cluster": itest.RedisCluster} {
		t.Run(name, func(t *testing.T) {
			rdb := redisconn.NewClient(rc(t))
			defer rdb.Close()
			ctx := context.Background()
			prefix := itest.Unique(t, "sluice_test_") + ":"
			other := prefix[:len(prefix)-1] + "_other:"
			t.Cleanup(func() { rdb.Del(ctx, other+"{keep}") })
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range 2500 {
					p.Set(ctx, fmt.Sprintf("%s{t%d}", prefix, i), "x", 0)
				}
				p.Set(ctx, other+"{keep}", "x", 0)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := flags.UnlinkKeys(ctx, rdb, prefix+"*"); err != nil {
				t.Fatal(err)
			}
			left := 0
			if err := flags.ScanKeys(ctx, rdb, prefix+"*", func(string) { left++ }); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Fatalf("%d of 2,500 keys left under the prefix", left)
			}
			if n := rdb.Exists(ctx, other+"{keep}").Val(); n != 1 {
				t.Fatal("a key outside the prefix was removed")
			}
		})
	}
}

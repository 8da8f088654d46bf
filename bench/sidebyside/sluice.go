package sidebyside

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// SluiceSide is Sluice's admission over the shared Redis: one Limiter (one
// gateway), both rules a tenant's (a SlidingWindow and a TokenBucket,
// checked and debited all-or-nothing), exact or leased.
func SluiceSide(b *testing.B, name string, ru Rules, exact bool, clients int) Side {
	b.Helper()
	c, pid := SharedRedis(b, clients+2)
	prefix := itest.Unique(b, "sluice:adm:") + ":"
	b.Cleanup(func() { DeletePrefix(c, prefix) })
	l, err := admission.New(c, &admission.Rules{Default: admission.TenantRules{Rules: []admission.Rule{
		{Name: "window", Unit: admission.Requests, Algorithm: admission.SlidingWindow, Limit: ru.WindowLimit, Window: ru.Window, Exact: exact},
		{Name: "bucket", Unit: admission.Requests, Algorithm: admission.TokenBucket, Limit: BucketBurst,
			Rate: float64(BucketBurst) / BucketPeriod.Seconds(), Exact: exact},
	}}}, admission.WithPrefix(prefix), admission.WithMaxWait(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return Side{
		Name: name, Servers: []int{pid}, Window: Sliding,
		Commands: func() int64 { return RedisCommands(c) },
		Decide: func(ctx context.Context, k int) (bool, int64, bool, error) {
			tk, err := l.Admit(ctx, admission.Request{Tenant: KeyName(k), Model: "m"})
			if err != nil {
				return false, 0, false, err
			}
			p := tk.Decision.Path
			return tk.Allowed(), 0, p == admission.PathLocal || p == admission.PathUnavailable, nil
		},
	}
}

// SharedRedis is a client of the services script's Redis, with a pool of
// pool connections, and the pid of that Redis, which runs on this machine:
// its CPU is read from /proc.
func SharedRedis(b *testing.B, pool int) (*redis.Client, int) {
	b.Helper()
	rc := itest.Redis(b)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true, PoolSize: pool})
	b.Cleanup(func() { c.Close() })
	pid, err := infoField(c, "server", "process_id")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		b.Fatalf("redis pid %d is not on this machine: %v", pid, err)
	}
	return c, int(pid)
}

// DeletePrefix deletes the keys under prefix: a side's, when the
// benchmark ends.
func DeletePrefix(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

// RedisCommands is Redis's count of commands processed so far (INFO
// stats), for Side.Commands.
func RedisCommands(c *redis.Client) int64 {
	n, _ := infoField(c, "stats", "total_commands_processed")
	return n
}

// infoField is one field of a section of Redis's INFO.
func infoField(c *redis.Client, section, field string) (int64, error) {
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO %s has no %s", section, field)
}

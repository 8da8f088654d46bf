package admission

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
)

// utcMonths is the calendar of the benchmark's monthly quota.
type utcMonths struct{}

func (utcMonths) Bounds(t time.Time) (start, end time.Time) {
	t = t.UTC()
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// BenchmarkPeriodQuotaMemory measures the Redis memory of a per-user
// monthly token quota as a calendar period rule: SLUICE_ADMISSION_BENCH_USERS
// users (1,000,000 by default) each admitted once through admit.lua (500
// tokens, pipelined 1,000 calls a round trip), on keys of the benchmark's
// own prefix. Per user: MEMORY USAGE of 1,000 of the keys, and the rise of
// INFO used_memory over the fill (the Redis is shared, so that one moves
// with what else runs). For comparison, the same quota as a 30-day sliding
// window keeps one field per 12-hour granule a user was active in: 1,000
// keys of a user active in every granule, by MEMORY USAGE.
func BenchmarkPeriodQuotaMemory(b *testing.B) {
	users := benchUsers(b)
	ctx := context.Background()
	c := testClient(b, "")
	prefix := benchPrefix(b, c)
	r := compileRule(Rule{Name: "user-monthly", Scope: Scope{User: Each}, Unit: TotalTokens, Algorithm: CalendarPeriod,
		Limit: 2_000_000, Calendar: utcMonths{}}, false, 0, mustMetrics(b))
	keyOf := func(i int) string {
		return instanceKey(prefix, r, Scope{Tenant: "acme", User: "user-" + strconv.Itoa(i)})
	}
	if err := admitScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	for range b.N { // the figures are of the last round
		unlinkPrefix(b, c, prefix)
		before := usedMemory(b, c)
		rate, gran, _ := r.args(time.Now())
		const batch = 1000
		for from := 0; from < users; from += batch {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := from; i < min(from+batch, users); i++ {
					admitScript.EvalSha(ctx, p, []string{keyOf(i)}, 1, r.kind, r.argLimit, rate, gran, 500, 0, 0)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		after := usedMemory(b, c)
		b.ReportMetric(float64(after-before)/float64(users), "admission_period_quota_info_bytes_per_user")
		b.ReportMetric(meanMemoryUsage(b, c, users, keyOf), "admission_period_quota_bytes_per_user")
	}
	// The same quota as a 30-day window: a field per active granule.
	w := compileRule(Rule{Name: "user-30d", Scope: Scope{User: Each}, Unit: TotalTokens, Algorithm: SlidingWindow,
		Limit: 2_000_000, Window: 30 * 24 * time.Hour}, false, 0, mustMetrics(b))
	winKey := func(i int) string {
		return instanceKey(prefix, w, Scope{Tenant: "acme", User: "user-" + strconv.Itoa(i)})
	}
	now := time.Now().UnixMilli() / w.gran
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 1000 {
			for g := range int64(Granules) {
				p.HIncrBy(ctx, winKey(i), strconv.FormatInt(now-g, 10), 500)
			}
			p.PExpire(ctx, winKey(i), time.Hour)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(meanMemoryUsage(b, c, 1000, winKey), "admission_month_window_bytes_per_active_user")
}

// benchUsers is SLUICE_ADMISSION_BENCH_USERS, the end users of the
// memory benchmarks: 1,000,000 by default.
func benchUsers(b *testing.B) int {
	v := os.Getenv("SLUICE_ADMISSION_BENCH_USERS")
	if v == "" {
		return 1_000_000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1000 {
		b.Fatalf("SLUICE_ADMISSION_BENCH_USERS=%q: want a number of at least 1000", v)
	}
	return n
}

func mustMetrics(b *testing.B) *metrics {
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// meanMemoryUsage is the mean MEMORY USAGE (SAMPLES 0: every field) of up
// to 1,000 keys spread over the first n.
func meanMemoryUsage(b *testing.B, c redis.UniversalClient, n int, key func(int) string) float64 {
	ctx := context.Background()
	step := max(n/1000, 1)
	var sum, count int64
	for i := 0; i < n; i += step {
		v, err := c.MemoryUsage(ctx, key(i), 0).Result()
		if err != nil {
			b.Fatalf("MEMORY USAGE %s: %v", key(i), err)
		}
		sum += v
		count++
	}
	return float64(sum) / float64(count)
}

func usedMemory(b *testing.B, c redis.UniversalClient) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
}

// benchPrefix is a key prefix of the benchmark's own; its keys are
// unlinked from c when the benchmark ends, since a million users' keys
// would otherwise stay in the shared Redis.
func benchPrefix(b *testing.B, c redis.UniversalClient) string {
	prefix := itest.Unique(b, "sluice:adm:bench:") + ":"
	b.Cleanup(func() { unlinkPrefix(b, c, prefix) })
	return prefix
}

// unlinkPrefix deletes every key under prefix.
func unlinkPrefix(b *testing.B, c redis.UniversalClient, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 10_000).Iterator()
	var keys []string
	flush := func() {
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				b.Error(fmt.Errorf("unlink: %w", err))
			}
			keys = keys[:0]
		}
	}
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 10_000 {
			flush()
		}
	}
	flush()
}

package admission

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(overshootEnv) != "" {
		os.Exit(overshootMain())
	}
	os.Exit(m.Run())
}

// testClient returns a client of the real Redis (or of addr) with context
// timeouts on, as New requires.
func testClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rc := itest.Redis(t)
	if addr == "" {
		addr = rc.Addr
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix is a key prefix of the test's own; its keys are deleted at
// the end.
func testPrefix(t testing.TB) string {
	t.Helper()
	p := itest.Unique(t, "sluice:adm:") + ":"
	t.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: itest.Redis(t).Addr})
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return p
}

func newTestLimiter(t testing.TB, c redis.UniversalClient, rules *Rules, opts ...Option) *Limiter {
	t.Helper()
	l, err := New(c, rules, append([]Option{WithMaxWait(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func mustAdmit(t testing.TB, l *Limiter, req Request) Ticket {
	t.Helper()
	tk, err := l.Admit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

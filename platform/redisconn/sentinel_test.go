package redisconn_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// sentinelFailoverBound is how long after the primary's kill -9 a client
// of redis.sentinel writes again, on the promoted replica: the Sentinels'
// down-after-milliseconds (2 s in scripts/services.sh), their vote and the
// promotion, and go-redis's FailoverClient finding the new primary.
// Measured 4-8 s (see docs/scaling.md).
const sentinelFailoverBound = 20 * time.Second

// TestSentinelFailover: a client built from redis.sentinel writes through
// the Sentinels' primary; the primary is killed -9 under a steady load of
// writes; the client writes again on the promoted replica within
// sentinelFailoverBound, and every write that WAIT confirmed on the
// replica before the kill is there afterwards. The killed node is started
// again by the services script and rejoins as a replica.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the services script's Redis primary")
	}
	itest.LockEngine(t, itest.EngineRedisSentinel, true)
	rc := itest.RedisSentinel(t)
	if err := rc.Validate(); err != nil {
		t.Fatal(err)
	}
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx := context.Background()
	itest.EventuallyNoError(t, 30*time.Second, "the Sentinels' primary answers", func() error { return redisconn.Ready(cl)(ctx) })

	sc := redis.NewSentinelClient(&redis.Options{Addr: rc.Sentinel.Addrs[0]})
	defer sc.Close()
	primary, err := sc.GetMasterAddrByName(ctx, rc.Sentinel.Master).Result()
	if err != nil {
		t.Fatal(err)
	}
	prefix := itest.Unique(t, "sentinel") + ":"

	var (
		mu        sync.Mutex
		confirmed []string // written, and WAIT saw the replica take it
		lastOK    time.Time
		firstFail time.Time
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			key := prefix + strconv.Itoa(i)
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			// One pipeline is one connection, so WAIT counts the
			// replicas that took this SET.
			var replicas *redis.Cmd
			_, err := cl.Pipelined(wctx, func(p redis.Pipeliner) error {
				p.Set(wctx, key, "v", time.Hour)
				replicas = p.Do(wctx, "WAIT", 1, 500)
				return nil
			})
			cancel()
			mu.Lock()
			if err == nil {
				lastOK = time.Now()
				if n, _ := replicas.Int64(); n >= 1 {
					confirmed = append(confirmed, key)
				}
			} else if firstFail.IsZero() {
				firstFail = time.Now()
			}
			mu.Unlock()
		}
	}()
	defer func() { close(stop); <-done }()
	itest.Eventually(t, 30*time.Second, "100 writes confirmed on the replica", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(confirmed) >= 100
	})

	p, _ := strconv.Atoi(primary[1])
	killed := time.Now()
	itest.KillEngineNode(t, itest.EngineRedisSentinel, p)
	mu.Lock()
	before := append([]string(nil), confirmed...)
	mu.Unlock()
	itest.Eventually(t, sentinelFailoverBound, "writes through redis.sentinel succeed again after the primary's kill -9", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lastOK.After(killed.Add(100 * time.Millisecond))
	})
	mu.Lock()
	resumed := lastOK.Sub(killed)
	mu.Unlock()
	now, err := sc.GetMasterAddrByName(ctx, rc.Sentinel.Master).Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(now, ":") == strings.Join(primary, ":") {
		t.Fatalf("the Sentinels still name %v as primary after its kill", now)
	}
	var lost []string
	for _, k := range before {
		n, err := cl.Exists(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			lost = append(lost, k)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d writes WAIT confirmed on the replica are gone after the failover: %v", len(lost), len(before), lost[:min(5, len(lost))])
	}
	rejoin := itest.RestartEngine(t, itest.EngineRedisSentinel)
	t.Logf("primary %v killed; writes resumed on %v after %v; %d confirmed writes kept; the old primary rejoined as a replica in %v",
		primary, now, resumed.Round(time.Millisecond), len(before), rejoin.Round(time.Millisecond))
}

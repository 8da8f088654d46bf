package enforcer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// A signal's offset is committed only once its flag is in Redis. An
// enforcer handles an error-ratio anomaly while Redis is unreachable (its
// flag cannot be written) and stops; the next enforcer of the same replica
// reads the signal again and enforces the breaker. With offsets committed
// as they were polled, the breaker was gone for good: it was in neither
// Redis nor the committed offsets, and ClickHouse gives back only quota
// breakers.
func TestSignalIsCommittedOnlyOnceItsFlagIsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	kc, rc := itest.Kafka(t), itest.Redis(t)
	ctx := context.Background()
	cfg := serviceTestConfig(t)
	topics := itest.Topics(t)
	cfg.Admin.Listen, cfg.Recover = "", false
	cfg.LeaderLease, cfg.HeartbeatEvery = time.Second, 200*time.Millisecond
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	sigAuth := itest.SignalAuth(t)
	signer := itest.Signer(t, sigAuth)
	line := itest.NewProxy(t, rc.Addr)
	viaLine := rc
	viaLine.Addr, viaLine.DialTimeout = line.Addr(), time.Second
	reg := prometheus.NewRegistry()
	env := platform.Env{Topics: topics, Logger: quietLog(), Metrics: reg, Kafka: kc, ClickHouse: itest.ClickHouse(t), Redis: viaLine, SignalAuth: sigAuth}.Named("test")
	start := time.Now().UnixMilli()
	svc, err := New(cfg, env)
	stopFirst := itest.RunService(t, svc, err)
	itest.Eventually(t, within, "the first enforcer's first full rewrite", func() bool {
		e, _ := rdb.Get(ctx, keys.Prefix+"epoch").Int64()
		return e >= start
	})

	// Redis goes away; the anomaly is read and handled, its flag unwritten.
	line.Cut()
	prod, err := kafkaconn.NewClient(kc, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const tenant = "erring"
	sig := errorRatio(tenant, "gpt-4o")
	val, err := schemas.EncodeSignal(sig)
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.ProduceSync(ctx, signer.Record(topics.Signals, []byte(tenant), val)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "the anomaly handled", func() bool {
		return itest.CounterValue(t, reg, "sluice_enforcer_signals_total", map[string]string{"result": "changed"}) >= 1
	})
	stopFirst()

	// The same replica starts again, Redis back.
	line.Restore()
	env.Redis, env.Metrics = rc, prometheus.NewRegistry()
	svc, err = New(cfg, env)
	itest.RunService(t, svc, err)
	itest.Eventually(t, within, "the error-ratio breaker enforced after the restart", func() bool {
		v, _ := rdb.HGet(ctx, keys.TenantKey(tenant), "gpt-4o").Result()
		return strings.Contains(v, string(flags.KindErrorRatio))
	})
}

// What each role may commit: the leader what a successful flush covered
// (handled before it began), a follower no further than the leader's own
// group nor than it handled itself, and nobody backwards.
func TestCommittableOffsets(t *testing.T) {
	o := newSignalOffsets()
	o.assign([]int32{0, 1})
	o.handled(0, 5, 1)
	flushed := o.onFlush() // a flush begins with offset 5 handled
	o.handled(0, 9, 1)     // handled while it runs: not covered
	if got := o.leaderCommittable(); len(got) != 0 {
		t.Fatalf("before the flush succeeded: %v, want nothing", got)
	}
	flushed()
	if got := o.leaderCommittable(); got[0].Offset != 5 {
		t.Fatalf("after the flush: %v, want partition 0 at 5", got)
	}
	o.committed[0] = 5
	o.onFlush() // a flush that fails: its func is never called
	if got := o.leaderCommittable(); len(got) != 0 {
		t.Fatalf("after a failed flush: %v, want nothing new", got)
	}

	o.handled(1, 20, 1)
	got := o.followerCommittable(map[int32]int64{0: 7, 1: 30, 2: 4})
	if got[0].Offset != 7 || got[1].Offset != 20 || len(got) != 2 {
		t.Fatalf("follower: %v, want partition 0 at 7 (the leader's), 1 at 20 (its own), nothing of 2 (not handled)", got)
	}
	if got := o.followerCommittable(map[int32]int64{0: 3}); len(got) != 0 {
		t.Fatalf("follower behind its last commit: %v, want nothing (never backwards)", got)
	}
	o.forget([]int32{0, 1})
	o.handled(1, 25, 1) // records of a revoked partition handled late
	if got := o.followerCommittable(map[int32]int64{0: 100, 1: 100}); len(got) != 0 {
		t.Fatalf("after the partitions were revoked: %v, want nothing", got)
	}
}

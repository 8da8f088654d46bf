package enforcer

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// TestForgedPeriodResetDoesNotLiftBreaker: anyone who can produce to the
// signals topic could lift a quota breaker with a period_reset. A running
// enforcer refuses and counts one that is unsigned, signed with the wrong
// secret, or carries a genuine signature of another record; the same
// reset signed with the shared key lifts the breaker.
func TestForgedPeriodResetDoesNotLiftBreaker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	kc, rc := itest.Kafka(t), itest.Redis(t)
	ctx := context.Background()
	cfg := serviceTestConfig(t)
	topics := itest.Topics(t)
	cfg.Admin.Listen, cfg.Recover = "", false
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	sigAuth := itest.SignalAuth(t)
	signer := itest.Signer(t, sigAuth)
	reg := prometheus.NewRegistry()
	env := platform.Env{Topics: topics, Logger: quietLog(), Metrics: reg, Kafka: kc, ClickHouse: itest.ClickHouse(t), Redis: rc, SignalAuth: sigAuth}.Named("test")
	svc, err := New(cfg, env)
	itest.RunService(t, svc, err)

	prod, err := kafkaconn.NewClient(kc, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(r *kgo.Record) {
		t.Helper()
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	encode := func(s *schemas.Signal) []byte {
		t.Helper()
		v, err := schemas.EncodeSignal(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tenant := itest.Unique(t, "forged-")
	layout := flags.Layout{Prefix: cfg.KeyPrefix}
	flag := func(model string) string {
		v, _ := rdb.HGet(ctx, layout.TenantKey(tenant), model).Result()
		return v
	}

	ex := exhausted(tenant, "gpt-4o")
	exRec := signer.Record(topics.Signals, []byte(tenant), encode(ex))
	produce(exRec)
	itest.Eventually(t, within, "quota breaker open", func() bool { return strings.Contains(flag("gpt-4o"), "daily_tokens") })

	reset := func() []byte {
		r := *ex
		r.ID = exhausted(tenant, "gpt-4o").ID
		r.Kind = schemas.SignalPeriodReset
		return encode(&r)
	}
	// 1. Unsigned, as any Kafka client would produce it.
	produce(&kgo.Record{Topic: topics.Signals, Key: []byte(tenant), Value: reset(),
		Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaSignalsV1)}}})
	// 2. Signed under the right key id with a guessed secret.
	forger, err := signalauth.Open(signalauth.Config{Keys: []string{"test:" + strings.Repeat("f", 64)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	produce(forger.Record(topics.Signals, []byte(tenant), reset()))
	// 3. A genuine signature, copied from the exhaustion record.
	copied := &kgo.Record{Topic: topics.Signals, Key: []byte(tenant), Value: reset(), Headers: exRec.Headers}
	produce(copied)

	itest.Eventually(t, within, "three forged resets counted", func() bool {
		return itest.CounterValue(t, reg, "sluice_enforcer_signals_total", map[string]string{"result": "unauthenticated"}) == 3
	})
	// A signed signal behind them on the same partition: once its flag is
	// written, anything the forged ones could have changed is written too.
	produce(signer.Record(topics.Signals, []byte(tenant), encode(exhausted(tenant, "gpt-4o-mini"))))
	itest.Eventually(t, within, "the signed signal after the forged ones", func() bool { return strings.Contains(flag("gpt-4o-mini"), "daily_tokens") })
	if f := flag("gpt-4o"); !strings.Contains(f, "daily_tokens") {
		t.Fatalf("a forged period_reset lifted the quota breaker: flag %q", f)
	}

	// The same reset, signed with the shared key, lifts it.
	produce(signer.Record(topics.Signals, []byte(tenant), reset()))
	itest.Eventually(t, within, "signed period_reset lifts the breaker", func() bool { return flag("gpt-4o") == "" })
	if n := itest.CounterValue(t, reg, "sluice_enforcer_signals_total", map[string]string{"result": "unauthenticated"}); n != 3 {
		t.Errorf("unauthenticated signals %v, want 3", n)
	}
}

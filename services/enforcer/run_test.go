package enforcer

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// The whole service: state recovered from ClickHouse on start, signals
// consumed from Kafka, flags in Redis, admin API served, clean shutdown.
func TestRunConsumesSignalsAndRecoversState(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	kc := itest.Kafka(t)
	chc := itest.ClickHouse(t)
	rc := itest.Redis(t)
	ctx := context.Background()
	conn := testClickHouse(t, chc)
	// The aggregator recorded an exhausted hard quota before we started.
	now := time.Now().UTC().Truncate(time.Second)
	b, err := conn.PrepareBatch(ctx, "INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used, quota_limit, unit, mode, tier, version, updated_at)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append("recovered", "*", "monthly_tokens", "month", now.Add(-time.Hour), now.Add(time.Hour), 2000.0, 1000.0, "tokens", "hard", uint16(100), uint64(1), now); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}

	cfg := serviceTestConfig(t)
	topics := itest.Topics(t)
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	cfg.Admin.Listen = ln.Addr().String()
	ln.Close()
	cfg.Admin.Tokens = []adminapi.Token{{Name: "ops", SHA256: adminapi.HashToken("tok")}}
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(testPolicyYAML), 0o600); err != nil {
		t.Fatal(err)
	}

	sigAuth := itest.SignalAuth(t)
	signer := itest.Signer(t, sigAuth)
	env := platform.Env{Topics: topics, Logger: quietLog(), Kafka: kc, ClickHouse: chc, Redis: rc, SignalAuth: sigAuth,
		Policy: platform.FileSource{File: policyFile, Reload: 100 * time.Millisecond}}.Named("test")
	svc, err := New(cfg, env)
	itest.RunService(t, svc, err)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	hasFlag := func(tenant, field, want string) func() bool {
		return func() bool {
			v, _ := rdb.HGet(ctx, keys.TenantKey(tenant), field).Result()
			return strings.Contains(v, want)
		}
	}
	itest.Eventually(t, within, "quota breaker recovered from quota_state", hasFlag("recovered", "*", "monthly_tokens"))

	prod, err := kafkaconn.NewClient(kc, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	sig := exhausted(itest.Unique(t, "kafka-"), "gpt-4o")
	val, err := schemas.EncodeSignal(sig)
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.ProduceSync(ctx, signer.Record(topics.Signals, []byte(sig.Tenant), val)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// A record that is not a signal is skipped, not fatal: the signal after
	// it on the same partition (same key) still takes effect.
	if err := prod.ProduceSync(ctx, signer.Record(topics.Signals, []byte(sig.Tenant), []byte("{not json"))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	after := exhausted(sig.Tenant, "gpt-4o-mini")
	if val, err = schemas.EncodeSignal(after); err != nil {
		t.Fatal(err)
	}
	if err := prod.ProduceSync(ctx, signer.Record(topics.Signals, []byte(sig.Tenant), val)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "flag from a Kafka signal", hasFlag(sig.Tenant, "gpt-4o", "daily_tokens"))
	itest.Eventually(t, within, "flag from the signal after a bad record", hasFlag(sig.Tenant, "gpt-4o-mini", "daily_tokens"))

	// The admin API is served, and lists the recovered breaker.
	cl, err := adminapi.NewClient("http://"+cfg.Admin.Listen, "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := cl.Breakers(ctx, "recovered")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(bs, func(b adminapi.Breaker) bool { return b.Kind == flags.KindQuota && b.Quota == "monthly_tokens" }) {
		t.Fatalf("admin API lists %+v, want the recovered monthly_tokens breaker", bs)
	}
	if m, _ := rdb.HGet(ctx, keys.FailModeKey(), "strict").Result(); m != "closed" {
		t.Fatalf("fail mode of tenant strict in redis: %q", m)
	}
	// A policy edit reaches the gateways' fail modes without a restart.
	edited := strings.Replace(testPolicyYAML, "fail_mode: closed", "fail_mode: open", 1)
	if err := os.WriteFile(policyFile, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "reloaded fail mode in redis", func() bool {
		m, _ := rdb.HGet(ctx, keys.FailModeKey(), "strict").Result()
		return m == "open"
	})
}

func TestConfigValidateNamesFieldAndLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.FlushInterval = 0
	cfg.BatchTenants = 0
	cfg.Admin.Tokens = []adminapi.Token{{Name: "x", SHA256: "abc"}}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"flush_interval: ", "1ms", "batch_tenants: ", "1..100000", "admin.tokens[0].sha256"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

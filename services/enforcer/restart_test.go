package enforcer

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// errorRatio is an anomaly signal from the error-ratio detector, bad enough
// to open the default error_ratio breaker (threshold 0.5, 20 requests).
func errorRatio(tenant, model string) *schemas.Signal {
	now := time.Now().UTC().Truncate(time.Second)
	n := signalSeq.Add(1)
	return &schemas.Signal{ID: schemas.SignalID("test-anomaly", tenant, model, now.String(), time.Duration(n).String()),
		Kind: schemas.SignalAnomaly, Time: now, Tenant: tenant, Model: model,
		Attributes: map[string]string{"detector": "error_ratio", "ratio": "0.9", "requests": "100"}}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A restarted enforcer never lowers enforcement: with ClickHouse
// unreachable (so nothing can be recovered from it), a blacklist, a quota
// breaker and an error-ratio breaker the previous enforcer wrote stay in
// Redis through the new one's first full rewrite, and a Checker keeps
// refusing the tenant (a fail-open one, so a stale view would not refuse).
func TestRestartWithoutClickHouseKeepsEveryFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	kc := itest.Kafka(t)
	rc := itest.Redis(t)
	ctx := context.Background()
	cfg := testConfig(t)
	topics := itest.Topics(t)
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	tenant := "restarted"

	// The first enforcer opens three breakers of three kinds, then stops.
	first, stop := startCore(t, cfg, rdb)
	now := time.Now()
	first.table.Blacklist(tenant, "leaked", "key leaked", "ops", now.Add(time.Hour), now)
	first.writer.MarkDirty(tenant)
	first.handle(exhausted(tenant, "gpt-4o"), now)
	first.handle(errorRatio(tenant, "claude"), now)
	fields := []string{flags.KeyField("leaked"), "gpt-4o", "claude"}
	itest.Eventually(t, within, "three flags written by the first enforcer", func() bool {
		n, _ := rdb.HLen(ctx, keys.TenantKey(tenant)).Result()
		return n == int64(len(fields))+1 // and the version field
	})
	stop()

	ch := startChecker(t, rc, cfg.KeyPrefix, 10*time.Second)
	refused := func() bool {
		return ch.Check(tenant, "gpt-4o", "").Outcome == checker.Refused &&
			ch.Check(tenant, "claude", "").Outcome == checker.Refused &&
			ch.Check(tenant, "other", "leaked").Outcome == checker.Refused
	}
	itest.Eventually(t, within, "checker refusing before the restart", refused)

	// The second enforcer starts with ClickHouse at a closed port.
	cfg.Group = itest.Unique(t, "enforcer_")
	cfg.Admin.Listen = ""
	chc := chconn.Defaults()
	chc.Addr = closedAddr(t)
	chc.DialTimeout = time.Second
	env := platform.Env{Topics: topics, Logger: quietLog(), Kafka: kc, ClickHouse: chc, Redis: rc, SignalAuth: itest.SignalAuth(t)}.Named("test")
	restarted := time.Now().UnixMilli()
	svc, err := New(cfg, env)
	itest.RunService(t, svc, err)
	// Its first full rewrite sets the epoch; everything it wrote then is in
	// Redis once a heartbeat after it is.
	itest.Eventually(t, within, "the restarted enforcer's first full rewrite", func() bool {
		e, _ := rdb.Get(ctx, cfg.KeyPrefix+"epoch").Int64()
		return e >= restarted
	})
	writerSettled(t, rdb, keys)
	got, err := rdb.HGetAll(ctx, keys.TenantKey(tenant)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if _, ok := got[f]; !ok {
			t.Errorf("flag %q of tenant %s is gone after the restart: %v", f, tenant, got)
		}
	}
	if !refused() {
		t.Errorf("checker lets tenant %s through after the restart: %+v %+v %+v", tenant,
			ch.Check(tenant, "gpt-4o", ""), ch.Check(tenant, "claude", ""), ch.Check(tenant, "other", "leaked"))
	}
}

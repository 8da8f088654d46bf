package enforcer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// TestForgedTombstoneAndCompactionRemoveNoAdminAction: readers refuse an
// unsigned tombstone, but Kafka's compaction does not read signatures: it
// keeps the last record of each key. A forger who produces tombstones with
// the keys an admin action would have (tenant, kind, scope) must not get a
// signed blacklist or override removed by compaction: after the broker
// compacted the topic, and Redis lost every flag (both enforcers down past
// the flag TTL), a fresh enforcer enforces both from the topic.
func TestForgedTombstoneAndCompactionRemoveNoAdminAction(t *testing.T) {
	a := newAdminTest(t)
	kc, rc, cfg := a.env.Kafka, a.env.Redis, a.cfg
	rdb := a.rdb
	ctx := context.Background()
	ch := startChecker(t, rc, cfg.KeyPrefix, 10*time.Second)
	prod := itest.CompactingTopic(t, kc, a.env.Topics.Admin)
	produce := func(key string, value []byte) {
		t.Helper()
		r := &kgo.Record{Topic: a.env.Topics.Admin, Key: []byte(key), Value: value,
			Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaAdminV1)}}}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	canary := itest.Unique(t, "canary-")
	produce(canary, []byte("1"))

	cl, _, stop := a.start(t)
	blocked, capped := itest.Unique(t, "bl-"), itest.Unique(t, "ov-")
	zero := 0.0
	if _, err := cl.Blacklist(ctx, adminapi.Request{Tenant: blocked, Reason: "fraud", ExpiresIn: "48h"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SetOverride(ctx, adminapi.Request{Tenant: capped, Model: "*", Quota: schemas.QuotaDailyTokens, Limit: &zero,
		Reason: "leaked key", ExpiresIn: "48h"}); err != nil {
		t.Fatal(err)
	}
	enforced := func(when string, ch *checker.Checker) {
		t.Helper()
		itest.Eventually(t, within, when+": blacklist enforced", func() bool {
			d := ch.Check(blocked, "gpt-4o", "")
			return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindBlacklist
		})
		itest.Eventually(t, within, when+": zero override enforced", func() bool {
			d := ch.Check(capped, "gpt-4o", "")
			return d.Outcome == checker.Refused && d.Flag.Quota == string(schemas.QuotaDailyTokens)
		})
	}
	enforced("running", ch)

	// The forger's tombstones, keyed as the actions' scopes are named.
	produce((&schemas.AdminState{Kind: schemas.AdminBlacklist, Tenant: blocked, Model: flags.AllModels}).Key(), nil)
	produce((&schemas.AdminState{Kind: schemas.AdminOverride, Tenant: capped, Model: "*", Quota: schemas.QuotaDailyTokens}).Key(), nil)
	produce(canary, []byte("2"))
	itest.WaitCompacted(t, kc, prod, a.env.Topics.Admin, canary)

	// Both enforcers down longer than the flag TTL: Redis holds nothing.
	stop()
	_ = flags.ScanKeys(ctx, rdb, cfg.KeyPrefix+"*", func(k string) { rdb.Del(ctx, k) })
	a.start(t)
	// A new Checker: the first one still remembers the flags Redis lost.
	enforced("after compaction and a restart with no flags", startChecker(t, rc, cfg.KeyPrefix, 10*time.Second))
}

// readAll returns every record topic holds now.
func readAll(t *testing.T, kc kafkaconn.Config, topic string) []*kgo.Record {
	t.Helper()
	ctx := context.Background()
	ends, err := kafkaconn.EndOffsets(ctx, kadm.NewClient(mustClient(t, kc)), topic)
	if err != nil {
		t.Fatal(err)
	}
	var end int64
	ends.Each(func(o kadm.ListedOffset) { end = max(end, o.Offset) })
	rd := mustClient(t, kc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	rctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for (len(out) == 0 || out[len(out)-1].Offset+1 < end) && rctx.Err() == nil {
		out = append(out, rd.PollFetches(rctx).Records()...)
	}
	return out
}

func mustClient(t *testing.T, kc kafkaconn.Config, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kafkaconn.NewClient(kc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestReplayedAdminRecordIsRefused: anyone able to write to the admin
// topic can copy a genuine signed record. Re-sending an override after an
// operator cleared it must not bring the raised quota back: a running
// enforcer, and a restarted one reading the whole topic, refuse the copy
// as a replay and count it; the override stays cleared.
func TestReplayedAdminRecordIsRefused(t *testing.T) {
	a := newAdminTest(t)
	kc := a.env.Kafka
	ctx := context.Background()
	cl, reg, stop := a.start(t)
	tenant := itest.Unique(t, "promo-")
	raised := 5e9
	req := adminapi.Request{Tenant: tenant, Model: "*", Quota: schemas.QuotaMonthlyTokens, Limit: &raised, Reason: "promotion", ExpiresIn: "2000h"}
	if _, err := cl.SetOverride(ctx, req); err != nil {
		t.Fatal(err)
	}
	// The genuine record, as anyone who can read the topic sees it.
	var genuine *kgo.Record
	for _, r := range readAll(t, kc, a.env.Topics.Admin) {
		if r.Value != nil && strings.Contains(string(r.Value), tenant) {
			genuine = r
		}
	}
	if genuine == nil {
		t.Fatal("the override's record is not on the admin topic")
	}
	req.Limit, req.Reason = nil, "promotion over"
	if _, err := cl.ClearOverride(ctx, req); err != nil {
		t.Fatal(err)
	}
	overrides := func() int {
		t.Helper()
		ovs, err := cl.Overrides(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		return len(ovs)
	}
	if n := overrides(); n != 0 {
		t.Fatalf("%d overrides after clearing it", n)
	}

	replay := &kgo.Record{Topic: a.env.Topics.Admin, Key: genuine.Key, Value: genuine.Value, Headers: genuine.Headers}
	if err := mustClient(t, kc).ProduceSync(ctx, replay).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The admin API answers once its replica applied its own record, which
	// the topic's one partition puts after the replay.
	if _, err := cl.Trip(ctx, adminapi.Request{Tenant: tenant, Model: "sentinel", Reason: "sentinel", ExpiresIn: "1h"}); err != nil {
		t.Fatal(err)
	}
	check := func(when string, reg *prometheus.Registry) {
		t.Helper()
		if n := overrides(); n != 0 {
			t.Errorf("%s: the replayed override is in force again (%d overrides)", when, n)
		}
		if n := itest.CounterValue(t, reg, "sluice_enforcer_admin_records_total", map[string]string{"result": "replayed"}); n != 1 {
			t.Errorf("%s: %v replayed admin records counted, want 1", when, n)
		}
	}
	check("running", reg)
	stop()
	cl, reg, _ = a.start(t)
	// The sentinel's breaker cannot tell that the restarted replica read
	// the topic past the replay: the flags in Redis may show it first
	// (core.restore). Reading the replay is what the counter shows; an
	// enforcer that applied it instead never counts it, and fails here.
	itest.Eventually(t, within, "restarted enforcer refused the replay", func() bool {
		return itest.CounterValue(t, reg, "sluice_enforcer_admin_records_total", map[string]string{"result": "replayed"}) >= 1
	})
	check("restarted", reg)
}

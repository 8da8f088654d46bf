package aggregator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
)

// TestRepartitionKeepsTenantTotals: adding partitions to the usage topic
// moves tenants to other partitions (murmur2 mod the new count). A tenant
// at 80% of its monthly quota whose home moves must not restart from zero
// there: the next 30% produce quota_exhausted, and quota_state holds the
// month's true total although the new partition's offsets are lower than
// the old one's.
func TestRepartitionKeepsTenantTotals(t *testing.T) {
	e, tenant := repartitionEnv(t)
	home := homePartitionOf
	// The old home gets many other events first, so its offsets (the old
	// row versions) are far above the new home's.
	filler := ""
	for i := 0; filler == ""; i++ {
		if tn := fmt.Sprintf("filler%d", i); home(tn, 3) == home(tenant, 3) && home(tn, 6) == home(tn, 3) {
			filler = tn
		}
	}
	r := runInProcess(t, e, e.ch.Addr, nil)

	send := toPartitions(t, e, time.Now().UTC().Truncate(time.Second))
	send(home(filler, 3), filler, 50, 1)
	send(home(tenant, 3), tenant, 8, 10_000)
	itest.Eventually(t, 90*time.Second, "80% consumed on the old home", caughtUp(t, e))

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if _, err := e.adm.CreatePartitions(ctx, 3, e.topic); err != nil {
		t.Fatal(err)
	}
	send(home(tenant, 6), tenant, 3, 10_000)

	sig, err := kafkaconn.NewClient(e.kafka, kgo.ConsumeTopics(e.signals), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer sig.Close()
	exhausted := false
	itest.Eventually(t, 90*time.Second, "quota_exhausted after the move", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer pcancel()
		sig.PollFetches(pctx).EachRecord(func(rec *kgo.Record) {
			var s schemas.Signal
			if schemas.DecodeSignal(rec.Value, &s) == nil && s.Kind == schemas.SignalQuotaExhausted && s.Tenant == tenant {
				exhausted = true
			}
		})
		return exhausted
	})
	itest.Eventually(t, 90*time.Second, "everything consumed after the move", caughtUp(t, e))
	var used float64
	if err := e.conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = ? AND model = '*' AND quota = 'monthly_tokens'", tenant).Scan(&used); err != nil || used != 110_000 {
		t.Errorf("%s monthly_tokens used %v (%v), want 110000", tenant, used, err)
	}
	if got := r.metric(t, "sluice_aggregator_restored_tenants_total", ""); got < 1 {
		t.Errorf("restored tenants %v, want the moved tenant", got)
	}
}

// TestAddPartitionsUnderLoadHandsOver adds partitions to the usage topic
// while four aggregators count a steady load, as an operator would: half
// the tenants move to a new home, producers switch to it at different
// times (one refreshes its metadata every half second, one keeps the old
// homes for minutes, as ingest does), retries of earlier events land on
// the other home. The moved tenants' new homes must take them over only
// once their old homes stored what they counted under the old count
// (handover.go): afterwards every quota_state and usage_minute row equals
// the sum over the distinct events ClickHouse holds, exactly.
func TestAddPartitionsUnderLoadHandsOver(t *testing.T) {
	// setup's usage topic has 3 partitions.
	e := integrationEnv(t, "defaults:\n  timezone: UTC\n  models:\n    \"*\": {monthly_tokens: 1000000000, hourly_tokens: 1000000000}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	parts, err := e.adm.ListTopics(ctx, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	before := len(parts[e.topic].Partitions)
	// Four instances over three partitions, six after the change: the
	// instances given none of the new partitions learn the new count only
	// at their next refresh, while the moved tenants' new homes already
	// count them — the window the hand-over must close.
	var aggs []*running
	for range 4 {
		aggs = append(aggs, runInProcess(t, e, e.ch.Addr, nil))
	}

	// fast switches to the new homes within a second of the change; slow
	// keeps the old ones until its next metadata refresh (5 minutes).
	fast, err := kafkaconn.NewClient(e.kafka, kgo.MetadataMaxAge(500*time.Millisecond), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	slow := e.cl
	const tenants = 30
	var (
		sent  = map[string]int64{} // "tenant/id" → tokens
		moved int
	)
	for i := range tenants {
		if tn := fmt.Sprintf("load%d", i); homePartitionOf(tn, before) != homePartitionOf(tn, 2*before) {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no load tenant moves; pick other names")
	}
	n := 0
	send := func(d time.Duration) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); {
			var recs []*kgo.Record
			now := time.Now().UTC()
			for range 20 {
				n++
				ev := schemas.UsageEvent{ID: fmt.Sprintf("ev%d", n), Time: now, Tenant: fmt.Sprintf("load%d", n%tenants),
					Model: "gpt-4o", PromptTokens: int64(100 + n%97), CompletionTokens: int64(n % 13)}
				if n%25 == 0 {
					// A retry of an event sent a moment ago, by the other producer.
					ev.ID, ev.Time = fmt.Sprintf("ev%d", n-20), now.Add(-50*time.Millisecond)
					ev.PromptTokens, ev.CompletionTokens = int64(100+(n-20)%97), int64((n-20)%13)
					ev.Tenant = fmt.Sprintf("load%d", (n-20)%tenants)
				}
				sent[ev.Tenant+"/"+ev.ID] = ev.PromptTokens + ev.CompletionTokens
				recs = append(recs, &kgo.Record{Topic: e.topic, Key: []byte(ev.Tenant), Value: eventjson.AppendUsageEventJSON(nil, &ev), Headers: v1Header})
			}
			for i, r := range recs {
				cl := fast
				if i%2 == 1 {
					cl = slow
				}
				cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
					if err != nil && ctx.Err() == nil {
						t.Errorf("produce: %v", err)
					}
				})
			}
			if err := fast.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := slow.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // pacing the load, not a timing assertion
		}
	}
	send(8 * time.Second)
	if _, err := e.adm.CreatePartitions(ctx, before, e.topic); err != nil {
		t.Fatal(err)
	}
	// The aggregators learn the new count within partitionsRefresh (10 s)
	// of each other; the load runs on through that and the rebalance.
	send(25 * time.Second)
	itest.Eventually(t, 120*time.Second, "everything consumed and committed", caughtUp(t, e))

	pol, err := policy.Load(e.policy)
	if err != nil {
		t.Fatal(err)
	}
	truth := loadDistinct(t, ctx, e.conn, pol)
	if len(truth) != len(sent) {
		t.Errorf("ClickHouse holds %d distinct events, %d were sent", len(truth), len(sent))
	}
	checkCounters(t, ctx, e.conn, truth, pol)
	waits := map[string]uint64{}
	for _, r := range aggs {
		for result, c := range r.histogramCounts(t, "sluice_aggregator_handover_wait_seconds") {
			waits[result] += c
		}
	}
	t.Logf("%d events (%d tenants, %d moved from %d to %d partitions); hand-over waits: %v", len(sent), tenants, moved, before, 2*before, waits)
	if waits["timeout"] > 0 {
		t.Errorf("%d hand-overs timed out", waits["timeout"])
	}
}

// homePartitionOf is the aggregator's home partition of tenant among n.
func homePartitionOf(tenant string, n int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(tenant)}, n))
}

// TestMovedTenantRestoreDoesNotStallOthers: a tenant whose home moved when
// the topic gained partitions is rebuilt on its new home from what
// ClickHouse stored, once its old home handed it over. That query runs
// beside the poll loop: with ClickHouse cut while it waits, another tenant
// of the same partition still gets its quota_exhausted (it waited for the
// whole outage when the restore held the poll loop); once ClickHouse is
// back the moved tenant's month carries over exactly.
func TestMovedTenantRestoreDoesNotStallOthers(t *testing.T) {
	e, mover := repartitionEnv(t)
	home := homePartitionOf
	// Both move to the same new partition (murmur2 mod 6 is the old home
	// or the old home + 3); stay is restored there before ClickHouse is
	// cut, mover after.
	stay := ""
	for i := 0; stay == ""; i++ {
		if tn := fmt.Sprintf("stay%d", i); home(tn, 6) == home(mover, 6) {
			stay = tn
		}
	}
	proxy := itest.NewProxy(t, e.ch.Addr)
	r := runInProcess(t, e, proxy.Addr(), nil)
	send := toPartitions(t, e, time.Now().UTC().Truncate(time.Second))
	send(home(mover, 3), mover, 8, 10_000)
	send(home(stay, 3), stay, 1, 10)
	itest.Eventually(t, 90*time.Second, "80% consumed on the old home", caughtUp(t, e))

	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	if _, err := e.adm.CreatePartitions(ctx, 3, e.topic); err != nil {
		t.Fatal(err)
	}
	// Every partition, the new ones included, committed under the new
	// count: the old home handed over, and the new partitions were
	// assigned and rebuilt while ClickHouse answered.
	itest.Eventually(t, 120*time.Second, "every partition committed under 6 partitions", func() bool {
		offs, err := e.adm.FetchOffsets(ctx, e.group)
		if err != nil {
			return false
		}
		for p := range int32(6) {
			o, ok := offs.Lookup(e.topic, p)
			if !ok || o.Err != nil || o.Metadata != "sluice-partitions=6" {
				return false
			}
		}
		return true
	})

	send(home(stay, 6), stay, 1, 10)
	itest.Eventually(t, 90*time.Second, "the other tenant restored on its new home", func() bool {
		return r.metric(t, "sluice_aggregator_restored_tenants_total", "") == 1
	})
	itest.Eventually(t, 90*time.Second, "its event stored", caughtUp(t, e))

	proxy.Cut()
	w := watchSignals(t, e)
	send(home(mover, 6), mover, 3, 10_000)
	sentAt := time.Now()
	send(home(stay, 6), stay, 1, 100_000)
	itest.Eventually(t, 60*time.Second, "the other tenant's quota_exhausted while the moved tenant's restore waits for ClickHouse", w.has(func(s *schemas.Signal) bool {
		return s.Kind == schemas.SignalQuotaExhausted && s.Tenant == stay
	}))
	t.Logf("%s signalled %s after its event, %s's restore pending", stay, time.Since(sentAt).Round(time.Millisecond), mover)
	if got := r.metric(t, "sluice_aggregator_restored_tenants_total", ""); got != 1 {
		t.Fatalf("%v tenants restored, want only the other one (the mover's restore must be waiting for ClickHouse)", got)
	}

	proxy.Restore()
	itest.Eventually(t, 90*time.Second, "the moved tenant's quota_exhausted once ClickHouse is back", w.has(func(s *schemas.Signal) bool {
		return s.Kind == schemas.SignalQuotaExhausted && s.Tenant == mover
	}))
	itest.Eventually(t, 90*time.Second, "everything stored once ClickHouse returned", caughtUp(t, e))
	var used float64
	if err := e.conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = ? AND model = '*' AND quota = 'monthly_tokens'", mover).Scan(&used); err != nil || used != 110_000 {
		t.Errorf("%s monthly_tokens used %v (%v), want 110000", mover, used, err)
	}
}

// toPartitions returns a function producing count events of tenant tn, of
// tokens prompt tokens each, model gpt-4o, stamped at, to partition part
// of the usage topic whatever the tenant's home; ids e1, e2, ... follow
// each other across calls.
func toPartitions(t *testing.T, e *env, at time.Time) func(part int32, tn string, count int, tokens int64) {
	n := 0
	return func(part int32, tn string, count int, tokens int64) {
		t.Helper()
		// A new client each time: it must see partitions added meanwhile.
		cl, err := kafkaconn.NewClient(e.kafka, kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var recs []*kgo.Record
		for range count {
			n++
			ev := schemas.UsageEvent{ID: fmt.Sprintf("e%d", n), Time: at, Tenant: tn, Model: "gpt-4o", PromptTokens: tokens}
			recs = append(recs, &kgo.Record{Topic: e.topic, Partition: part, Key: []byte(tn), Value: eventjson.AppendUsageEventJSON(nil, &ev), Headers: v1Header})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// repartitionEnv sets up a 3-partition usage topic with a monthly quota
// of 100,000 tokens on every tenant (integrationEnv, so it skips the test
// in -short mode) and returns a tenant whose home moves when the topic
// grows to 6 partitions.
func repartitionEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := integrationEnv(t, "defaults:\n  timezone: UTC\n  models:\n    \"*\": {monthly_tokens: 100000}\n")
	for i := 0; ; i++ {
		if tn := fmt.Sprintf("mover%d", i); homePartitionOf(tn, 3) != homePartitionOf(tn, 6) {
			return e, tn
		}
	}
}

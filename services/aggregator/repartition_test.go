package aggregator_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
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
	if testing.Short() {
		t.Skip("integration test")
	}
	e := setup(t) // 3 partitions
	if err := os.WriteFile(e.policy, []byte("defaults:\n  timezone: UTC\n  models:\n    \"*\": {monthly_tokens: 100000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	home := func(tenant string, n int) int32 {
		return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(tenant)}, n))
	}
	tenant := ""
	for i := 0; tenant == ""; i++ {
		if tn := fmt.Sprintf("mover%d", i); home(tn, 3) != home(tn, 6) {
			tenant = tn
		}
	}
	// The old home gets many other events first, so its offsets (the old
	// row versions) are far above the new home's.
	filler := ""
	for i := 0; filler == ""; i++ {
		if tn := fmt.Sprintf("filler%d", i); home(tn, 3) == home(tenant, 3) && home(tn, 6) == home(tn, 3) {
			filler = tn
		}
	}
	r := runInProcess(t, e, e.ch.Addr, nil)

	at := time.Now().UTC().Truncate(time.Second)
	n := 0
	send := func(part int32, tn string, count int, tokens int64) {
		t.Helper()
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

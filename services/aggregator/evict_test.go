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

// TestIdleTenantEvictedAndRestored: a tenant silent for longer than
// idle_evict_after (event time) is dropped from memory; when it sends again
// in the same month it is rebuilt from ClickHouse, and its month and day
// totals in quota_state equal the distinct events ClickHouse holds.
func TestIdleTenantEvictedAndRestored(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	e := setup(t)
	pol := "defaults:\n  timezone: UTC\n  models:\n    \"*\": {monthly_tokens: 100000000, daily_tokens: 10000000}\n"
	if err := os.WriteFile(e.policy, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runInProcess(t, e, e.ch.Addr, nil)

	// Both tenants on partition 0 (their home partition of 3: the aggregator
	// re-routes records found elsewhere), so the busy one moves its clock.
	cl, err := kafkaconn.NewClient(e.kafka, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	send := func(evs ...schemas.UsageEvent) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		recs := make([]*kgo.Record, len(evs))
		for i := range evs {
			recs[i] = &kgo.Record{Topic: e.topic, Partition: 0, Key: []byte(evs[i].Tenant), Value: eventjson.AppendUsageEventJSON(nil, &evs[i]), Headers: v1Header}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Date(2026, 3, 10, 1, 0, 0, 0, time.UTC)
	var sent int64
	var idle []schemas.UsageEvent
	for i := 0; i < 60; i++ {
		ev := schemas.UsageEvent{ID: fmt.Sprintf("idle-%d", i), Time: base.Add(time.Duration(i) * 10 * time.Second), Tenant: "quiet1",
			Model: fmt.Sprintf("m%d", i%2), PromptTokens: int64(100 + i), CompletionTokens: 7}
		idle = append(idle, ev)
		sent += ev.TotalTokens()
	}
	send(idle...)
	send(idle[:5]...) // retries: counted once
	itest.Eventually(t, 90*time.Second, "the quiet tenant's events consumed", caughtUp(t, e))

	var busy []schemas.UsageEvent
	for i := 0; i < 30; i++ {
		busy = append(busy, schemas.UsageEvent{ID: fmt.Sprintf("busy-%d", i), Time: base.Add(3*time.Hour + time.Duration(i)*time.Minute), Tenant: "busy1", Model: "m0", PromptTokens: 10})
	}
	send(busy...)
	itest.Eventually(t, 90*time.Second, "the quiet tenant's three series to be evicted", func() bool {
		return r.metric(t, "sluice_aggregator_evicted_series_total", "") >= 3
	})

	back := schemas.UsageEvent{ID: "idle-back", Time: base.Add(3*time.Hour + 40*time.Minute), Tenant: "quiet1", Model: "m1", PromptTokens: 1000, CompletionTokens: 1}
	sent += back.TotalTokens()
	send(back, idle[7]) // and one more retry of an event counted before the eviction
	itest.Eventually(t, 90*time.Second, "the quiet tenant restored", func() bool {
		return r.metric(t, "sluice_aggregator_restored_tenants_total", "") >= 1
	})
	itest.Eventually(t, 90*time.Second, "the returning events consumed", caughtUp(t, e))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var truth uint64
	if err := e.conn.QueryRow(ctx, `SELECT sum(p + c) FROM (SELECT argMax(prompt_tokens, kafka_offset) AS p, argMax(completion_tokens, kafka_offset) AS c
 FROM usage_events WHERE tenant = 'quiet1' GROUP BY id)`).Scan(&truth); err != nil {
		t.Fatal(err)
	}
	if int64(truth) != sent {
		t.Fatalf("ClickHouse holds %d tokens for the quiet tenant, %d were sent", truth, sent)
	}
	for _, q := range []string{"monthly_tokens", "daily_tokens"} {
		var used float64
		var start time.Time
		if err := e.conn.QueryRow(ctx, `SELECT argMax(used, version), argMax(period_start, version) FROM quota_state
 WHERE tenant = 'quiet1' AND model = '*' AND quota = ? GROUP BY period_start ORDER BY period_start DESC LIMIT 1`, q).Scan(&used, &start); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if uint64(used) != truth {
			t.Errorf("%s of the restored tenant (period from %v): used %v, ClickHouse's distinct events say %d", q, start, used, truth)
		}
	}
}

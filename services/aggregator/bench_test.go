package aggregator_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
)

// BenchmarkPipeline reports aggregator_pipeline_events_per_sec: the whole
// path — real broker → decode → aggregate → ClickHouse (raw events, minute
// rollups, quota state) → signals → offset commit — for 400,000 events
// already on a 3-partition topic (1,000 tenants × 4 models, quotas on every
// tenant), from the aggregator's start until every offset is committed.
// Production is not timed; the group join and rebuild at start are. One
// in-process aggregator, default batch sizes.
// aggregator_pipeline_vs_bare_insert_ratio divides it by
// aggregator_bare_insert_events_per_sec, the same events only inserted
// into ClickHouse in the same run (see bareInsertEventsPerSec).
func BenchmarkPipeline(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the real broker and ClickHouse")
	}
	const n = 400_000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := setup(b)
		base := time.Now().UTC().Add(-2 * time.Hour)
		evs := make([]schemas.UsageEvent, n)
		for j := range evs {
			evs[j] = schemas.UsageEvent{
				ID: fmt.Sprintf("b-%08d", j), Time: base.Add(time.Duration(j) * 20 * time.Millisecond),
				Tenant: fmt.Sprintf("t%d", j%1000), Model: fmt.Sprintf("m%d", (j/1000)%4),
				PromptTokens: int64(100 + j%400), CompletionTokens: int64(j % 200), LatencyMS: int64(j % 3000), Outcome: schemas.OutcomeOK,
			}
		}
		for j := 0; j < n; j += 20_000 {
			produce(b, e, evs[j:j+20_000])
		}
		b.StartTimer()
		start := time.Now()
		r := runInProcess(b, e, e.ch.Addr, nil)
		itest.Eventually(b, 5*time.Minute, "all events committed", caughtUp(b, e))
		elapsed := time.Since(start)
		b.StopTimer()
		if err := r.stop(); err != nil {
			b.Fatal(err)
		}
		eps := n / elapsed.Seconds()
		b.ReportMetric(eps, "aggregator_pipeline_events_per_sec")
		ref := bareInsertEventsPerSec(b, evs)
		b.ReportMetric(ref, "aggregator_bare_insert_events_per_sec")
		b.ReportMetric(eps/ref, "aggregator_pipeline_vs_bare_insert_ratio")
	}
}

// bareInsertEventsPerSec is the reference of
// aggregator_pipeline_vs_bare_insert_ratio, measured in the same run on
// the same machine: the same events inserted into usage_events of a fresh
// database as the aggregator inserts them (column batches of 50,000, the
// default batch_events), with no broker, decoding, counting, rollups or
// commits.
func bareInsertEventsPerSec(b *testing.B, evs []schemas.UsageEvent) float64 {
	cfg := itest.ClickHouse(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := chconn.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := migrations.Apply(ctx, conn, slog.New(slog.DiscardHandler)); err != nil {
		b.Fatal(err)
	}
	store := chstore.New(conn, func() chstore.CostFunc { return nil }, 0)
	batches := make([]*chstore.Batch, 0, len(evs)/50_000+1)
	for j := 0; j < len(evs); j += 50_000 {
		bt := &chstore.Batch{}
		for k := j; k < min(j+50_000, len(evs)); k++ {
			bt.Events = append(bt.Events, chstore.Event{UsageEvent: evs[k], Partition: int32(k % 3), Offset: int64(k / 3)})
		}
		batches = append(batches, bt)
	}
	start := time.Now()
	for _, bt := range batches {
		if err := store.Write(ctx, bt); err != nil {
			b.Fatal(err)
		}
	}
	return float64(len(evs)) / time.Since(start).Seconds()
}

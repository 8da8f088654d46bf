package aggregator_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// BenchmarkPipeline reports aggregator_pipeline_events_per_sec: the whole
// path — real broker → decode → aggregate → ClickHouse (raw events, minute
// rollups, quota state) → signals → offset commit — for 400,000 events
// already on a 3-partition topic (1,000 tenants × 4 models, quotas on every
// tenant), from the aggregator's start until every offset is committed.
// Production is not timed; the group join and rebuild at start are. One
// in-process aggregator, default batch sizes.
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
		b.ReportMetric(n/elapsed.Seconds(), "aggregator_pipeline_events_per_sec")
	}
}

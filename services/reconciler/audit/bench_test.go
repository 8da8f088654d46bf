package audit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// BenchmarkReconcileDay audits one tenant's day of 100,000 events over 3
// models whose counters agree, so a single observation reads everything:
// the day's quota_state rows, 4 x 1,440 usage_minute rows and the events.
func BenchmarkReconcileDay(b *testing.B) {
	conn := dbTB(b)
	pol := mustPolicy(b, `
tenants:
  bench:
    models:
      "*": {daily_tokens: 1000000000, hourly_tokens: 100000000}
`)
	tn := pol.Tenant("bench")
	day := time.Date(2026, 10, 14, 0, 0, 0, 0, time.UTC)
	const n = 100000
	evs := make([]event, n)
	for i := range evs {
		evs[i] = event{id: fmt.Sprintf("b%d", i), time: day.Add(time.Duration(i) * 24 * time.Hour / n), model: fmt.Sprintf("m%d", i%3),
			prompt: uint64(100 + i%50), completion: uint64(20 + i%7), offset: int64(i)}
	}
	insertEvents(b, conn, "bench", evs...)
	agg := aggregate(evs)
	var minutes []minuteFixture
	for model, byMinute := range agg {
		for m, u := range byMinute {
			minutes = append(minutes, minuteFixture{model, m, u})
		}
	}
	insertMinutes(b, conn, "bench", 1, minutes...)
	quotas := []quotaFixture{{"*", schemas.QuotaDailyTokens, schemas.PeriodDay, day, day.AddDate(0, 0, 1), sumTokens(agg, "*", day, day.AddDate(0, 0, 1)), 1e9, "tokens", "hard"}}
	for h := day; h.Before(day.AddDate(0, 0, 1)); h = h.Add(time.Hour) {
		quotas = append(quotas, quotaFixture{"*", schemas.QuotaHourlyTokens, schemas.PeriodHour, h, h.Add(time.Hour), sumTokens(agg, "*", h, h.Add(time.Hour)), 1e8, "tokens", "hard"})
	}
	insertQuotas(b, conn, "bench", 1, quotas...)
	now := day.AddDate(0, 0, 2)
	a := New(conn, nil, Options{Settle: time.Minute, Now: func() time.Time { return now }})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := a.Reconcile(context.Background(), Job{Tenant: tn, Period: schemas.PeriodDay, At: day})
		if err != nil {
			b.Fatal(err)
		}
		if res.Drifted != 0 {
			b.Fatalf("fixture drifted: %+v", res)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

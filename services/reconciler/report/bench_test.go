package report

import (
	"context"
	"testing"
)

// BenchmarkMonthly builds one tenant's month while 1,000,000 events of 100
// other tenants share the table, the case where filtering by tenant before
// the per-id collapse matters (about 180 ms per report here).
func BenchmarkMonthly(b *testing.B) {
	conn, pol := setup(b)
	ctx := context.Background()
	if err := conn.Exec(ctx, `INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, kafka_offset)
SELECT concat('z', toString(number)), toDateTime('2026-11-01 00:00:00', 'UTC') + (number % 2500000),
       concat('other', toString(number % 100)), 'gpt-4o', 100, 10, toInt64(number)
FROM system.numbers LIMIT 1000000`); err != nil {
		b.Fatal(err)
	}
	acme := pol.Tenant("acme")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m, err := Build(ctx, conn, acme, ByTenant, november)
		if err != nil {
			b.Fatal(err)
		}
		if len(m.Lines) != 3 {
			b.Fatalf("lines %+v", m.Lines)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/report")
}

package audit

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// TestTokenTypesInTruthAndMinuteRepair: the audit's truth prices every
// token type at its own price — a priced model's, and an unpriced one's
// at unpriced_price — for budgets and for quotas that count
// billed-equivalent tokens, and a usage_minute row that lacks an event's
// cache writes or reasoning tokens is drift, repaired with them.
func TestTokenTypesInTruthAndMinuteRepair(t *testing.T) {
	conn := db(t)
	ctx := context.Background()
	pol := mustPolicy(t, strings.Replace(strings.Replace(acmePolicy, "prompt: 3, completion: 15, cached: 0.3}",
		"prompt: 3, completion: 15, cached: 0.3, cache_write: 3.75, reasoning: 20}", 1),
		"        monthly_tokens: 10000000\n", "        monthly_tokens: 10000000\n        count: billed\n", 1)+
		"unpriced_price: {currency: USD, prompt: 10, completion: 30, cached: 1, cache_write: 12, reasoning: 40}\n")
	tn := pol.Tenant("acme")
	at := utc("2026-10-14T03:15:00Z") // in the Shanghai day of 2026-10-14
	// 1,000 plain input, 2,000 cache reads, 3,000 cache writes, 4,000
	// plain output, 5,000 reasoning.
	evs := []event{
		{id: "c", time: at, model: "claude-x", prompt: 6000, completion: 9000, cached: 2000, cacheWrite: 3000, reasoning: 5000, offset: 1},
		{id: "m", time: at, model: "mystery", prompt: 6000, completion: 9000, cached: 2000, cacheWrite: 3000, reasoning: 5000, offset: 2},
	}
	insertEvents(t, conn, "acme", evs...)
	insertPrices(t, conn, pol)
	now := utc("2026-11-02T00:00:00Z")
	a := New(conn, nil, Options{Settle: 15 * time.Minute, ConfirmDelay: 50 * time.Millisecond,
		Now: func() time.Time { return now }, Unpriced: pol.UnpricedPrice})

	// The minutes as an aggregator that dropped cache writes and
	// reasoning would have written them.
	var stale []minuteFixture
	for model, byMinute := range aggregate(evs) {
		for m, u := range byMinute {
			u.cacheWrite, u.reasoning = 0, 0
			stale = append(stale, minuteFixture{model, m, u})
		}
	}
	insertMinutes(t, conn, "acme", 10, stale...)
	day := Job{Tenant: tn, Period: schemas.PeriodDay, At: at}
	res, err := a.Reconcile(ctx, day)
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"claude-x", "mystery", "*"} {
		if r := byKey(res.Rows)[model+"|usage_minute|minute|2026-10-14T03:15:00Z"]; !r.Drifted || !r.Repaired {
			t.Errorf("%s minute without cache writes and reasoning = %+v, want drifted and repaired", model, r)
		}
	}
	for _, table := range []string{"usage_minute", "quota_state"} {
		// quota_state: the day's missing daily_tokens counter, written by
		// the repair.
		var write, reasoning uint64
		if err := conn.QueryRow(ctx, "SELECT cache_write_tokens, reasoning_tokens FROM "+table+" FINAL WHERE tenant = 'acme' AND model = '*' LIMIT 1").
			Scan(&write, &reasoning); err != nil {
			t.Fatal(table, err)
		}
		if write != 6000 || reasoning != 10000 {
			t.Errorf("repaired tenant-wide %s row: cache write %d, reasoning %d; want 6000, 10000", table, write, reasoning)
		}
	}

	month := Job{Tenant: tn, Period: schemas.PeriodMonth, At: at}
	start, end := month.Bounds()
	cost := (1000*3+2000*0.3+3000*3.75+4000*15+5000*20)/1e6 + (1000*10+2000*1+3000*12+4000*30+5000*40)/1e6
	// Billed-equivalent: claude-x's cost over its input price, mystery's
	// at unpriced_price's, per token.
	billed := (1000*3+2000*0.3+3000*3.75+4000*15+5000*20)/3. + (1000*10+2000*1+3000*12+4000*30+5000*40)/10.
	insertQuotas(t, conn, "acme", 3,
		quotaFixture{"*", schemas.QuotaBudget, schemas.PeriodMonth, start, end, cost, 500, "currency", "hard"},
		quotaFixture{"*", schemas.QuotaMonthlyTokens, schemas.PeriodMonth, start, end, billed, 10000000, "tokens", "hard"})
	res, err = a.Reconcile(ctx, month)
	if err != nil {
		t.Fatal(err)
	}
	if b := byKey(res.Rows)["*|budget|month|2026-09-30T16:00:00Z"]; math.Abs(b.Truth-cost) > 1e-12 || b.Drifted {
		t.Errorf("budget row = %+v, want truth %v (each token type at its price) and no drift", b, cost)
	}
	if q := byKey(res.Rows)["*|monthly_tokens|month|2026-09-30T16:00:00Z"]; math.Abs(q.Truth-billed) > 1e-9 || q.Drifted {
		t.Errorf("billed monthly_tokens row = %+v, want truth %v billed-equivalent tokens (not the 30000 total) and no drift", q, billed)
	}
}

package costquery_test

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/reconciler/costquery"
)

// TestCostExprIsTheViews: the usage_priced view (migration 055) and
// costquery collapse events and compute cost with the same expression
// text.
func TestCostExprIsTheViews(t *testing.T) {
	view, err := fs.ReadFile(migrations.FS(), "055_usage_priced_levels.sql")
	if err != nil {
		t.Fatal(err)
	}
	squash := func(s string) string {
		s = strings.Join(strings.Fields(s), " ")
		return strings.NewReplacer("( ", "(", " )", ")").Replace(s)
	}
	for _, expr := range []string{costquery.PricedExpr + " AS priced", costquery.CostExpr + " AS cost", costquery.Distinct("1")} {
		if !strings.Contains(squash(string(view)), squash(expr)) {
			t.Errorf("migration 055's usage_priced does not compute %s", expr)
		}
	}
}

// The prices of the cross-check: gpt-4o changes price twice, mini is
// priced only from Nov 15 (earlier events are unpriced), and "mystery"
// never is. policyV2 corrects gpt-4o's second change, which a later sync
// re-inserts.
const policyV1 = `
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
  - {model: gpt-4o, currency: USD, effective_from: 2026-11-15T00:00:00Z, prompt: 2, completion: 8, cached: 1, cache_write: 2.5, reasoning: 11}
  - {model: gpt-4o, currency: USD, effective_from: 2026-11-20T12:00:00Z, prompt: 9, completion: 9, cached: 9}
  - {model: mini, currency: EUR, effective_from: 2026-11-15T00:00:00Z, prompt: 0.15, completion: 0.6, cached: 0.075}
`

var policyV2 = strings.Replace(policyV1, "prompt: 9, completion: 9, cached: 9", "prompt: 1.7, completion: 6.8, cached: 0.17", 1)

type event struct {
	id, model    string
	at           time.Time
	p, c, cached int64
	write, reas  int64 // cache_write_tokens, reasoning_tokens
	offset       int64
	estimated    uint8
	superseded   bool // an older version of an id: FINAL drops it
}

// TestViewCostEqualsPriceCost inserts events and prices into real
// ClickHouse (18.16 in CI) and checks, row by row, that the usage_priced
// view and costquery.Events price every distinct event exactly as
// policy.Price.Cost does with the price policy.Policy.Price picks for the
// event's time: around each price change, with cached tokens (none, some,
// all, and more than the prompt, which only a direct insert can store),
// for an unpriced model and time, after a corrected price, and for a
// settled estimate; and with every token type at once (cache writes and
// reasoning priced apart or, where the entry leaves them out, at input
// and output), each type at its own price.
func TestViewCostEqualsPriceCost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, conn := migrationtest.Open(t)
	v1 := parse(t, policyV1)
	pol := parse(t, policyV2)
	if p, _ := pol.Price("gpt-4o", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); p.Prompt != 1.7 {
		t.Fatalf("policyV2 does not correct the price: %+v", p)
	}
	synced := time.Now().Add(-time.Hour)
	if _, err := pricetable.Sync(ctx, conn, v1.Prices(), synced); err != nil {
		t.Fatal(err)
	}
	// The corrected entry gets a later inserted_at, which price_periods
	// prefers; the Go side knows only the corrected policy.
	if n, err := pricetable.Sync(ctx, conn, pol.Prices(), synced.Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("correcting sync wrote %d rows, %v; want 1", n, err)
	}

	change1 := time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)
	change2 := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	var evs []event
	add := func(model string, at time.Time, p, c, cached int64, more ...int64) {
		e := event{id: fmt.Sprintf("e%03d", len(evs)), model: model, at: at, p: p, c: c, cached: cached, offset: int64(len(evs) + 1)}
		if len(more) == 2 {
			e.write, e.reas = more[0], more[1]
		}
		evs = append(evs, e)
	}
	for _, at := range []time.Time{
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), // the first price's first second
		time.Date(2026, 6, 30, 13, 14, 15, 0, time.UTC),
		change1.Add(-time.Second), change1, change1.Add(time.Second),
		change2.Add(-time.Second), change2, change2.Add(36 * time.Hour),
		time.Date(2025, 12, 31, 23, 59, 59, 0, time.UTC), // before any gpt-4o price
	} {
		for _, model := range []string{"gpt-4o", "mini", "mystery"} {
			add(model, at, 1000, 200, 0)
			add(model, at, 3333, 777, 1111)
			add(model, at, 4096, 1, 4096)         // every prompt token cached
			add(model, at, 10, 5, 25)             // more cached than prompt
			add(model, at, 0, 0, 0)               // an empty call
			add(model, at, 999_999_937, 1_000, 7) // near the per-event limit
			// Every token type: reads, writes, plain input, reasoning and
			// plain output.
			add(model, at, 6000, 9000, 2000, 3000, 5000)
			add(model, at, 100, 10, 80, 50, 30) // writes and reasoning beyond what holds them
			add(model, at, 5000, 700, 0, 5000, 700)
		}
	}
	// An estimate settled by a later event with the same id: only the
	// settlement is priced.
	evs = append(evs,
		event{id: "est", model: "gpt-4o", at: change1.Add(time.Hour), p: 50_000, c: 50_000, offset: 10_000, estimated: 1, superseded: true},
		event{id: "est", model: "gpt-4o", at: change1.Add(time.Hour), p: 1234, c: 567, cached: 89, offset: 10_001})

	b, err := conn.PrepareBatch(ctx, `INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens,
cached_tokens, cache_write_tokens, reasoning_tokens, outcome, estimated, kafka_partition, kafka_offset, ingested_at)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if err := b.Append(e.id, e.at, "acme", e.model, uint64(e.p), uint64(e.c), uint64(e.cached), uint64(e.write), uint64(e.reas),
			"ok", e.estimated, int32(0), e.offset, e.at); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}

	want := map[string]event{}
	for _, e := range evs {
		if !e.superseded {
			want[e.id] = e
		}
	}
	for name, q := range map[string]string{
		// The view has no billed column: -1 skips that check.
		"usage_priced view": "SELECT id, priced, currency, cost, -1. FROM usage_priced WHERE tenant = ?",
		"costquery.Events":  "SELECT id, priced, currency, cost, billed FROM (" + costquery.Events("tenant = ?", "1") + ")",
	} {
		t.Run(name, func(t *testing.T) { compare(t, ctx, conn, q, pol, want) })
	}
}

func compare(t *testing.T, ctx context.Context, conn driver.Conn, query string, pol *policy.Policy, want map[string]event) {
	rows, err := conn.Query(ctx, query, "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	priced := 0
	for rows.Next() {
		var (
			id, currency string
			isPriced     uint8
			cost, billed float64
		)
		if err := rows.Scan(&id, &isPriced, &currency, &cost, &billed); err != nil {
			t.Fatal(err)
		}
		e, ok := want[id]
		if !ok || seen[id] {
			t.Errorf("row %s: unexpected or repeated", id)
			continue
		}
		seen[id] = true
		pr, ok := pol.Price(e.model, e.at)
		switch {
		case !ok && (isPriced != 0 || cost != 0):
			t.Errorf("%s %s at %s: SQL priced %d cost %v, but the policy has no price then", id, e.model, e.at.Format(time.RFC3339), isPriced, cost)
		case ok && (isPriced != 1 || currency != pr.Currency):
			t.Errorf("%s %s at %s: SQL priced %d in %q, want the price from %s in %s", id, e.model, e.at.Format(time.RFC3339), isPriced, currency, pr.EffectiveFrom.Format(time.RFC3339), pr.Currency)
		case ok:
			priced++
			// Bit for bit: both sides do the same float operations in the
			// same order.
			tok := policy.Tokens{Prompt: e.p, Completion: e.c, Cached: e.cached, CacheWrite: e.write, Reasoning: e.reas}
			if goCost := pr.Cost(tok); cost != goCost {
				t.Errorf("%s %s at %s (%+v): SQL cost %v, policy.Price.Cost %v",
					id, e.model, e.at.Format(time.RFC3339), tok, cost, goCost)
			}
			if goBilled := pr.BilledTokens(tok); billed != -1 && billed != goBilled {
				t.Errorf("%s %s at %s (%+v): SQL billed-equivalent tokens %v, policy.Price.BilledTokens %v",
					id, e.model, e.at.Format(time.RFC3339), tok, billed, goBilled)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(want) {
		t.Errorf("SQL returned %d distinct events, want %d", len(seen), len(want))
	}
	if priced < len(want)/3 {
		t.Errorf("only %d of %d events priced; the fixture does not exercise the formula", priced, len(want))
	}
}

func parse(t *testing.T, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(doc), "prices.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEstimateAndSettlementAcrossMidnightCountOnce: an estimate written at
// 23:59:50 and settled at 00:00:20 the next UTC day lie in two day
// partitions of usage_events, where FINAL cannot fold them. The view, the
// daily rollup and the time-bounded query must each count the request
// once, at the settlement's time and figures — also when the settlement
// has the lower offset (the flag decides first).
func TestEstimateAndSettlementAcrossMidnightCountOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, conn := migrationtest.Open(t)
	day1 := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	day2 := day1.AddDate(0, 0, 1)
	b, err := conn.PrepareBatch(ctx, `INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens,
cached_tokens, outcome, estimated, kafka_partition, kafka_offset, ingested_at)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		id        string
		at        time.Time
		p, c      uint64
		estimated uint8
		offset    int64
	}{
		{"pair", day2.Add(-10 * time.Second), 1000, 1000, 1, 1},
		{"pair", day2.Add(20 * time.Second), 100, 50, 0, 2},
		// Settled with a lower offset than its estimate: the settlement
		// still wins.
		{"late-est", day2.Add(30 * time.Second), 7, 3, 0, 3},
		{"late-est", day1.Add(23*time.Hour + 59*time.Minute), 700, 300, 1, 4},
	} {
		if err := b.Append(e.id, e.at, "acme", "gpt-4o", e.p, e.c, uint64(0), "ok", e.estimated, int32(0), e.offset, e.at); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}

	var n, tokens uint64
	if err := conn.QueryRow(ctx, "SELECT count(), sum(total_tokens) FROM usage_priced WHERE tenant = 'acme'").Scan(&n, &tokens); err != nil {
		t.Fatal(err)
	}
	if n != 2 || tokens != 160 {
		t.Errorf("usage_priced: %d events, %d tokens; want 2 events, 160 tokens (the settlements only)", n, tokens)
	}
	for _, d := range []struct {
		day    time.Time
		tokens uint64
	}{{day1, 0}, {day2, 160}} {
		var daily uint64
		if err := conn.QueryRow(ctx, "SELECT toUInt64(sum(total_tokens)) FROM usage_daily WHERE tenant = 'acme' AND day = toDate(?)",
			d.day.Format(time.DateOnly)).Scan(&daily); err != nil {
			t.Fatal(err)
		}
		if daily != d.tokens {
			t.Errorf("usage_daily %s: %d tokens, want %d", d.day.Format(time.DateOnly), daily, d.tokens)
		}
		var got uint64
		if err := conn.QueryRow(ctx, "SELECT toUInt64(sum(total_tokens)) FROM ("+costquery.EventsBetween()+")",
			costquery.BetweenArgs("acme", d.day, d.day.AddDate(0, 0, 1))...).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != d.tokens {
			t.Errorf("costquery.EventsBetween %s: %d tokens, want %d", d.day.Format(time.DateOnly), got, d.tokens)
		}
	}
}

// Package pricetable keeps ClickHouse's prices table in step with the price
// list of the quota policy, so SQL reports price usage exactly as the
// policy does. Entries are only ever added: a price change in the policy is
// a new entry with a later effective_from, and history is never rewritten.
// An entry whose figures were corrected in the policy (same model and
// effective_from) is re-inserted with a later inserted_at, which the
// price_periods view prefers.
package pricetable

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/policy"
)

type key struct {
	model string
	from  int64
}

type entry struct {
	currency                   string
	prompt, completion, cached float64
	cacheWrite, reasoning      float64
}

// Sync inserts every policy price the table lacks or holds with different
// figures, stamped with now, and returns how many rows it wrote. Entries
// the policy no longer lists are left in the table: past reports keep
// their prices.
func Sync(ctx context.Context, conn driver.Conn, prices []policy.Price, now time.Time) (int, error) {
	rows, err := conn.Query(ctx, `
SELECT model, effective_from, argMax(currency, inserted_at), argMax(prompt_per_million, inserted_at),
       argMax(completion_per_million, inserted_at), argMax(cached_per_million, inserted_at),
       argMax(cache_write_per_million, inserted_at), argMax(reasoning_per_million, inserted_at)
FROM prices GROUP BY model, effective_from`)
	if err != nil {
		return 0, fmt.Errorf("pricetable: read prices: %w", err)
	}
	have := map[key]entry{}
	for rows.Next() {
		var (
			m  string
			at time.Time
			e  entry
		)
		if err := rows.Scan(&m, &at, &e.currency, &e.prompt, &e.completion, &e.cached, &e.cacheWrite, &e.reasoning); err != nil {
			rows.Close()
			return 0, fmt.Errorf("pricetable: scan prices: %w", err)
		}
		have[key{m, at.Unix()}] = e
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("pricetable: read prices: %w", err)
	}
	var missing []policy.Price
	for _, p := range prices {
		want := entry{p.Currency, p.Prompt, p.Completion, p.Cached, p.CacheWrite, p.Reasoning}
		if got, ok := have[key{p.Model, p.EffectiveFrom.Unix()}]; !ok || got != want {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return 0, nil
	}
	b, err := conn.PrepareBatch(ctx, `INSERT INTO prices (model, currency, effective_from, prompt_per_million,
completion_per_million, cached_per_million, cache_write_per_million, reasoning_per_million, note, inserted_at)`)
	if err != nil {
		return 0, fmt.Errorf("pricetable: insert prices: %w", err)
	}
	for _, p := range missing {
		if err := b.Append(p.Model, p.Currency, p.EffectiveFrom, p.Prompt, p.Completion, p.Cached, p.CacheWrite, p.Reasoning,
			"from quota policy", now); err != nil {
			_ = b.Abort()
			return 0, fmt.Errorf("pricetable: insert price of %s from %s: %w", p.Model, p.EffectiveFrom.Format(time.RFC3339), err)
		}
	}
	if err := b.Send(); err != nil {
		return 0, fmt.Errorf("pricetable: insert prices: %w", err)
	}
	return len(missing), nil
}

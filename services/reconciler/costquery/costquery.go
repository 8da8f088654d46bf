// Package costquery builds the one SQL query that prices usage events, so
// the reconciler's budget audit and the cost reports compute cost the same
// way as the usage_priced view (migrations 046, 052 and 055): each distinct event joined
// with the price span containing its time.
//
// # Distinct events
//
// usage_events is a ReplacingMergeTree partitioned by day, so FINAL only
// folds the versions of an id that share a day partition. An estimate and
// its settlement carry different times (the estimate is written before the
// upstream call, the settlement after it); a pair across UTC midnight sits
// in two partitions and FINAL returns both. So every query here collapses
// per (tenant, id) with GROUP BY first — the settlement beats an estimate,
// then the higher Kafka offset wins (Version) — and filters by time only
// after the collapse, on the time of the version that won. Filtering first
// would let an estimate whose settlement lies outside the range count in
// the range.
//
// The view is for people; programs use this query because it filters
// usage_events before the collapse and the join. ClickHouse 18.16 does
// not push an outer WHERE through a view's join, so a filtered read of the
// view scans every tenant's events: measured on 3M events of other
// tenants, 2.0s through the view against 0.16s with the filter inside.
package costquery

import "time"

// Columns are the columns Events returns, in order.
const Columns = "tenant, model, id, time, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens, " +
	"total_tokens, outcome, estimated, priced, currency, cost, billed, user, api_key_id, session_id"

// Version orders the rows of one (tenant, id): a settlement (estimated =
// 0) beats any estimate, and among equals the higher Kafka offset (the
// table's ReplacingMergeTree version) wins.
const Version = `(estimated = 0, kafka_offset)`

// SettleMargin is how far apart in time an estimate and its settlement may
// lie and still be collapsed by a time-bounded query (EventsBetween): the
// pre-collapse filter reads this much before and after the range, so the
// other version of an id near a boundary is seen. A pair further apart
// than this is counted in each range its versions fall in; the views,
// which read the whole table, are exact.
const SettleMargin = 24 * time.Hour

// PricedExpr is 1 for an event joined with a priced span of
// price_spans (migration 045), 0 for one before its model's first price
// (the leading unpriced span) or of a model without any price (no span;
// the LEFT JOIN fills in the epoch).
const PricedExpr = `toUInt8(toUInt32(effective_from) != 0)`

// CostExpr is the cost of one event joined with its price span: 0 when
// unpriced (see PricedExpr), otherwise policy.Price.Cost's formula — each
// token type at its own price, each part clamped as Tokens.Split clamps
// it — in the same order of operations, so SQL and Go agree to the last
// bit. The usage_priced view (migration 055) spells the same expressions
// (a migration cannot import a Go constant, and an applied migration may
// not change); TestCostExprIsTheViews keeps the texts equal and
// TestViewCostEqualsPriceCost checks the figures against the Go code.
// toUInt64 keeps least's arguments of one type: a difference of UInt64s
// is signed.
const CostExpr = `if(toUInt32(effective_from) = 0, 0.,
   (toFloat64(prompt_tokens - least(cached_tokens, prompt_tokens)
              - least(cache_write_tokens, toUInt64(prompt_tokens - least(cached_tokens, prompt_tokens)))) * prompt_per_million
    + toFloat64(least(cached_tokens, prompt_tokens)) * cached_per_million
    + toFloat64(least(cache_write_tokens, toUInt64(prompt_tokens - least(cached_tokens, prompt_tokens)))) * cache_write_per_million
    + toFloat64(completion_tokens - least(reasoning_tokens, completion_tokens)) * completion_per_million
    + toFloat64(least(reasoning_tokens, completion_tokens)) * reasoning_per_million) / 1000000.)`

// BilledExpr is policy.Price.BilledTokens of one event joined with its
// price span, in the same order of operations: the cost over the input
// price per token, or the total tokens where no input price is in force
// (unpriced: the caller weighs those at unpriced_price, as the aggregator
// does). Quotas with count: billed are audited against it.
const BilledExpr = `if(toUInt32(effective_from) = 0 OR NOT (prompt_per_million > 0), toFloat64(prompt_tokens + completion_tokens),
   ` + CostExpr + ` * 1000000. / prompt_per_million)`

// Distinct returns a query of one row per (tenant, id) among the
// usage_events rows that satisfy pre (a condition over usage_events
// columns, with ? placeholders), the version Version picks, with the
// columns tenant, id, model, time, prompt_tokens, completion_tokens,
// cached_tokens, cache_write_tokens, reasoning_tokens, outcome, estimated,
// user, api_key_id, session_id (the levels a report groups by below the
// tenant). The collapsed columns get other names
// inside the GROUP BY: an alias equal to a column name would make
// argMax(time, ...) refer to itself.
func Distinct(pre string) string {
	return `SELECT tenant, id, d_model AS model, d_time AS time, d_prompt AS prompt_tokens, d_completion AS completion_tokens,
       d_cached AS cached_tokens, d_cache_write AS cache_write_tokens, d_reasoning AS reasoning_tokens,
       d_outcome AS outcome, d_estimated AS estimated, d_user AS user, d_key AS api_key_id, d_session AS session_id
FROM
(
    SELECT tenant, id,
           argMax(model, ` + Version + `) AS d_model,
           argMax(time, ` + Version + `) AS d_time,
           argMax(prompt_tokens, ` + Version + `) AS d_prompt,
           argMax(completion_tokens, ` + Version + `) AS d_completion,
           argMax(cached_tokens, ` + Version + `) AS d_cached,
           argMax(cache_write_tokens, ` + Version + `) AS d_cache_write,
           argMax(reasoning_tokens, ` + Version + `) AS d_reasoning,
           argMax(outcome, ` + Version + `) AS d_outcome,
           argMax(estimated, ` + Version + `) AS d_estimated,
           argMax(user, ` + Version + `) AS d_user,
           argMax(api_key_id, ` + Version + `) AS d_key,
           argMax(session_id, ` + Version + `) AS d_session
    FROM usage_events
    WHERE ` + pre + `
    GROUP BY tenant, id
)`
}

// Events returns a query over distinct usage events (see Distinct) whose
// rows before the collapse satisfy pre and whose collapsed row satisfies
// post (a condition over the columns of Distinct), each with its price and
// cost; see Columns. Events of a model without a price at their time have
// priced = 0, currency "" and cost 0. Placeholders bind in text order:
// pre's, then post's.
func Events(pre, post string) string {
	return `SELECT tenant, model, id, time, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens,
       prompt_tokens + completion_tokens AS total_tokens, outcome, estimated,
       ` + PricedExpr + ` AS priced, currency,
       ` + CostExpr + ` AS cost,
       ` + BilledExpr + ` AS billed, user, api_key_id, session_id
FROM
(
    SELECT tenant, model, id, time, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens,
           outcome, estimated, user, api_key_id, session_id
    FROM (` + Distinct(pre) + `)
    WHERE ` + post + `
) AS e
ALL LEFT JOIN price_spans USING (model)
WHERE (time >= effective_from AND time < effective_to) OR toUInt32(effective_to) = 0`
}

// EventsBetween is Events for the distinct events of one tenant whose
// collapsed time lies in [start, end); bind BetweenArgs. The rows read
// before the collapse reach SettleMargin beyond the range on both sides,
// so an estimate in the range whose settlement lies just outside it is
// replaced by the settlement (and leaves the range), not counted.
func EventsBetween() string {
	return Events("tenant = ? AND time >= ? AND time < ?", "time >= ? AND time < ?")
}

// BetweenArgs are EventsBetween's arguments, in UTC: bound times travel as
// literals naming their zone, and UTC is the one zone every server knows.
func BetweenArgs(tenant string, start, end time.Time) []any {
	start, end = start.UTC(), end.UTC()
	return []any{tenant, start.Add(-SettleMargin), end.Add(SettleMargin), start, end}
}

-- Cost per token type. usage_priced (046) priced prompt tokens less the
-- cached ones at the prompt price and every completion token at the
-- completion price, so cache writes (priced above input) and reasoning
-- (where priced apart from output) were billed wrong. Each type is now
-- charged at its own price (policy.Price.Cost):
--
--   input     = prompt - cached - cache_write      at prompt_per_million
--   cached    = cached_tokens                      at cached_per_million
--   write     = cache_write_tokens                 at cache_write_per_million
--   output    = completion - reasoning             at completion_per_million
--   reasoning = reasoning_tokens                   at reasoning_per_million
--
-- each part clamped to what contains it. The views that finance reads
-- gain the token types as columns; cost is costquery.CostExpr and the
-- inner query costquery.Distinct("1") (TestCostExprIsTheViews keeps the
-- texts equal). The views are dropped dependants first and created again:
-- a view cannot change its columns in place.
DROP TABLE IF EXISTS usage_monthly;

DROP TABLE IF EXISTS usage_daily;

DROP TABLE IF EXISTS usage_priced;

DROP TABLE IF EXISTS price_spans;

DROP TABLE IF EXISTS price_periods;

-- As 040, with the two new prices.
CREATE VIEW IF NOT EXISTS price_periods AS
SELECT
    model,
    tupleElement(p, 1) AS effective_from,
    tupleElement(p, 2) AS effective_to,
    tupleElement(p, 3) AS currency,
    tupleElement(p, 4) AS prompt_per_million,
    tupleElement(p, 5) AS completion_per_million,
    tupleElement(p, 6) AS cached_per_million,
    tupleElement(p, 7) AS cache_write_per_million,
    tupleElement(p, 8) AS reasoning_per_million
FROM
(
    SELECT
        model,
        arraySort(x -> tupleElement(x, 1), groupArray((effective_from, currency, prompt, completion, cached, cache_write, reasoning))) AS sorted,
        arrayMap(x -> tupleElement(x, 1), sorted) AS froms,
        arrayPushBack(arraySlice(froms, 2), toDateTime('2105-12-31 00:00:00', 'UTC')) AS tos,
        arrayMap((x, t) -> (tupleElement(x, 1), t, tupleElement(x, 2), tupleElement(x, 3), tupleElement(x, 4), tupleElement(x, 5),
                            tupleElement(x, 6), tupleElement(x, 7)), sorted, tos) AS periods
    FROM
    (
        SELECT
            model,
            effective_from,
            argMax(currency, inserted_at) AS currency,
            argMax(prompt_per_million, inserted_at) AS prompt,
            argMax(completion_per_million, inserted_at) AS completion,
            argMax(cached_per_million, inserted_at) AS cached,
            argMax(cache_write_per_million, inserted_at) AS cache_write,
            argMax(reasoning_per_million, inserted_at) AS reasoning
        FROM prices
        GROUP BY model, effective_from
    )
    GROUP BY model
)
ARRAY JOIN periods AS p;

-- As 045, with the two new prices.
CREATE VIEW IF NOT EXISTS price_spans AS
SELECT model, effective_from, effective_to, currency, prompt_per_million, completion_per_million, cached_per_million,
       cache_write_per_million, reasoning_per_million
FROM price_periods
UNION ALL
SELECT
    model,
    toDateTime(0, 'UTC') AS effective_from,
    first_price AS effective_to,
    '' AS currency,
    0. AS prompt_per_million,
    0. AS completion_per_million,
    0. AS cached_per_million,
    0. AS cache_write_per_million,
    0. AS reasoning_per_million
FROM
(
    SELECT model, toDateTime(min(effective_from), 'UTC') AS first_price
    FROM prices
    GROUP BY model
);

CREATE VIEW IF NOT EXISTS usage_priced AS
SELECT
    tenant,
    model,
    id,
    time,
    toDate(time, 'UTC') AS day,
    toStartOfMonth(toDate(time, 'UTC')) AS month,
    prompt_tokens,
    completion_tokens,
    cached_tokens,
    cache_write_tokens,
    reasoning_tokens,
    prompt_tokens + completion_tokens AS total_tokens,
    estimated,
    outcome,
    toUInt8(toUInt32(effective_from) != 0) AS priced,
    currency,
    if(toUInt32(effective_from) = 0, 0.,
       (toFloat64(prompt_tokens - least(cached_tokens, prompt_tokens)
                  - least(cache_write_tokens, toUInt64(prompt_tokens - least(cached_tokens, prompt_tokens)))) * prompt_per_million
        + toFloat64(least(cached_tokens, prompt_tokens)) * cached_per_million
        + toFloat64(least(cache_write_tokens, toUInt64(prompt_tokens - least(cached_tokens, prompt_tokens)))) * cache_write_per_million
        + toFloat64(completion_tokens - least(reasoning_tokens, completion_tokens)) * completion_per_million
        + toFloat64(least(reasoning_tokens, completion_tokens)) * reasoning_per_million) / 1000000.) AS cost
FROM
(
    SELECT tenant, id, d_model AS model, d_time AS time, d_prompt AS prompt_tokens, d_completion AS completion_tokens,
           d_cached AS cached_tokens, d_cache_write AS cache_write_tokens, d_reasoning AS reasoning_tokens,
           d_outcome AS outcome, d_estimated AS estimated
    FROM
    (
        SELECT tenant, id,
               argMax(model, (estimated = 0, kafka_offset)) AS d_model,
               argMax(time, (estimated = 0, kafka_offset)) AS d_time,
               argMax(prompt_tokens, (estimated = 0, kafka_offset)) AS d_prompt,
               argMax(completion_tokens, (estimated = 0, kafka_offset)) AS d_completion,
               argMax(cached_tokens, (estimated = 0, kafka_offset)) AS d_cached,
               argMax(cache_write_tokens, (estimated = 0, kafka_offset)) AS d_cache_write,
               argMax(reasoning_tokens, (estimated = 0, kafka_offset)) AS d_reasoning,
               argMax(outcome, (estimated = 0, kafka_offset)) AS d_outcome,
               argMax(estimated, (estimated = 0, kafka_offset)) AS d_estimated
        FROM usage_events
        WHERE 1
        GROUP BY tenant, id
    )
) AS e
ALL LEFT JOIN price_spans USING (model)
WHERE (time >= effective_from AND time < effective_to) OR toUInt32(effective_to) = 0;

-- As 042, with the token types.
CREATE VIEW IF NOT EXISTS usage_daily AS
SELECT
    tenant,
    model,
    day,
    currency,
    count() AS requests,
    sum(prompt_tokens) AS prompt_tokens,
    sum(completion_tokens) AS completion_tokens,
    sum(cached_tokens) AS cached_tokens,
    sum(cache_write_tokens) AS cache_write_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    sum(total_tokens) AS total_tokens,
    sum(cost) AS cost,
    countIf(priced = 0) AS unpriced_requests
FROM usage_priced
GROUP BY tenant, model, day, currency;

-- As 043, with the token types.
CREATE VIEW IF NOT EXISTS usage_monthly AS
SELECT
    tenant,
    model,
    month,
    currency,
    count() AS requests,
    sum(prompt_tokens) AS prompt_tokens,
    sum(completion_tokens) AS completion_tokens,
    sum(cached_tokens) AS cached_tokens,
    sum(cache_write_tokens) AS cache_write_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    sum(total_tokens) AS total_tokens,
    sum(cost) AS cost,
    countIf(priced = 0) AS unpriced_requests
FROM usage_priced
GROUP BY tenant, model, month, currency;

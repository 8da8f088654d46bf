-- usage_priced (041) lost every event of a priced model that came before
-- the model's first price: the join found the model's price periods, none
-- contained the event, and the WHERE dropped the event instead of keeping
-- it unpriced. Reports under-counted that usage, and the reconciler's
-- truth (the same join, services/reconciler/costquery) did too.
--
-- price_spans is price_periods plus, for every model with a price, a
-- leading unpriced span from the epoch to its first price, so every event
-- of a priced model meets exactly one span. A span is priced when its
-- effective_from is not the epoch; an event of a model without any price
-- meets no span, and the LEFT JOIN's defaults (epoch) leave it unpriced.
CREATE VIEW IF NOT EXISTS price_spans AS
SELECT model, effective_from, effective_to, currency, prompt_per_million, completion_per_million, cached_per_million
FROM price_periods
UNION ALL
SELECT
    model,
    toDateTime(0, 'UTC') AS effective_from,
    first_price AS effective_to,
    '' AS currency,
    0. AS prompt_per_million,
    0. AS completion_per_million,
    0. AS cached_per_million
FROM
(
    -- In a subquery: an alias effective_from in the same SELECT would
    -- shadow the column inside min().
    SELECT model, toDateTime(min(effective_from), 'UTC') AS first_price
    FROM prices
    GROUP BY model
);

DROP TABLE IF EXISTS usage_priced;

-- The view of 041 over price_spans. cost is costquery.CostExpr.
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
    prompt_tokens + completion_tokens AS total_tokens,
    estimated,
    outcome,
    toUInt8(toUInt32(effective_from) != 0) AS priced,
    currency,
    if(toUInt32(effective_from) = 0, 0.,
       (toFloat64(prompt_tokens - least(cached_tokens, prompt_tokens)) * prompt_per_million
        + toFloat64(least(cached_tokens, prompt_tokens)) * cached_per_million
        + toFloat64(completion_tokens) * completion_per_million) / 1000000.) AS cost
FROM
(
    SELECT tenant, model, id, time, prompt_tokens, completion_tokens, cached_tokens, estimated, outcome
    FROM usage_events FINAL
) AS e
ALL LEFT JOIN price_spans USING (model)
WHERE (time >= effective_from AND time < effective_to) OR toUInt32(effective_to) = 0;

-- Reports per level (issue 34): usage_priced gains the levels below the
-- tenant that usage events carry — the end user (user), the API key
-- (api_key_id) and the agent session (session_id) — each the value of the
-- version that won the collapse, so finance can group cost by any of them
-- (docs/finance.md has the queries; an organisation is the tenants the
-- policy names with its organization:). The rest is 052's view; the inner
-- query is costquery.Distinct("1") (TestCostExprIsTheViews). A view cannot
-- change its columns in place: dependants are dropped first and all three
-- created again.
DROP TABLE IF EXISTS usage_monthly;

DROP TABLE IF EXISTS usage_daily;

DROP TABLE IF EXISTS usage_priced;

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
    user,
    api_key_id,
    session_id,
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
           d_outcome AS outcome, d_estimated AS estimated, d_user AS user, d_key AS api_key_id, d_session AS session_id
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
               argMax(estimated, (estimated = 0, kafka_offset)) AS d_estimated,
               argMax(user, (estimated = 0, kafka_offset)) AS d_user,
               argMax(api_key_id, (estimated = 0, kafka_offset)) AS d_key,
               argMax(session_id, (estimated = 0, kafka_offset)) AS d_session
        FROM usage_events
        WHERE 1
        GROUP BY tenant, id
    )
) AS e
ALL LEFT JOIN price_spans USING (model)
WHERE (time >= effective_from AND time < effective_to) OR toUInt32(effective_to) = 0;

-- As 052.
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

-- As 052.
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

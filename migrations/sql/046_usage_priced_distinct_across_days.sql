-- usage_priced (041, 045) read usage_events FINAL, which folds the versions
-- of an id only within one day partition (PARTITION BY toYYYYMMDD(time)).
-- An estimate and its settlement have different times; a pair across UTC
-- midnight lies in two partitions, FINAL kept both, and usage_daily,
-- usage_monthly and every finance query counted the request twice.
--
-- This view collapses each (tenant, id) with GROUP BY first: the
-- settlement (estimated = 0) beats any estimate, then the higher Kafka
-- offset wins; time, day and month are the winning version's. The inner
-- query is costquery.Distinct("1") and cost is costquery.CostExpr
-- (TestCostExprIsTheViews keeps the texts equal).
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
    SELECT tenant, id, d_model AS model, d_time AS time, d_prompt AS prompt_tokens, d_completion AS completion_tokens,
           d_cached AS cached_tokens, d_outcome AS outcome, d_estimated AS estimated
    FROM
    (
        SELECT tenant, id,
               argMax(model, (estimated = 0, kafka_offset)) AS d_model,
               argMax(time, (estimated = 0, kafka_offset)) AS d_time,
               argMax(prompt_tokens, (estimated = 0, kafka_offset)) AS d_prompt,
               argMax(completion_tokens, (estimated = 0, kafka_offset)) AS d_completion,
               argMax(cached_tokens, (estimated = 0, kafka_offset)) AS d_cached,
               argMax(outcome, (estimated = 0, kafka_offset)) AS d_outcome,
               argMax(estimated, (estimated = 0, kafka_offset)) AS d_estimated
        FROM usage_events
        WHERE 1
        GROUP BY tenant, id
    )
) AS e
ALL LEFT JOIN price_spans USING (model)
WHERE (time >= effective_from AND time < effective_to) OR toUInt32(effective_to) = 0;

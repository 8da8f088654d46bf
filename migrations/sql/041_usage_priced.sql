-- Every usage event once (FINAL keeps the highest Kafka offset per tenant
-- and id, so retries collapse and a settled estimate replaces its
-- pre-debit), with the price in force at its time and its cost.
--
-- cost = ((prompt - cached) * prompt price + cached * cached price
--         + completion * completion price) / 1e6, in `currency`.
-- An event of a model without a price for its time keeps cost 0 and
-- priced = 0, so a missing price shows up in reports instead of hiding
-- usage. day and month are UTC; for a tenant's own calendar group by
-- toDate(time, 'Zone/Name') instead (see docs/finance.md).
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
    toUInt8(toUInt32(effective_to) != 0) AS priced,
    currency,
    if(toUInt32(effective_to) = 0, 0.,
       (toFloat64(prompt_tokens - least(cached_tokens, prompt_tokens)) * prompt_per_million
        + toFloat64(least(cached_tokens, prompt_tokens)) * cached_per_million
        + toFloat64(completion_tokens) * completion_per_million) / 1000000.) AS cost
FROM
(
    SELECT tenant, model, id, time, prompt_tokens, completion_tokens, cached_tokens, estimated, outcome
    FROM usage_events FINAL
) AS e
ALL LEFT JOIN price_periods USING (model)
WHERE (time >= effective_from AND time < effective_to) OR toUInt32(effective_to) = 0;

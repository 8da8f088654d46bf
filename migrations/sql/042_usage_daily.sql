-- Usage and cost per tenant, model and UTC day, from distinct events.
-- unpriced_requests counts events no price covered (their cost is 0).
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
    sum(total_tokens) AS total_tokens,
    sum(cost) AS cost,
    countIf(priced = 0) AS unpriced_requests
FROM usage_priced
GROUP BY tenant, model, day, currency;

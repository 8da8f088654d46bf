-- Usage and cost per tenant, model and UTC calendar month, from distinct
-- events. month is the first day of the month.
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
    sum(total_tokens) AS total_tokens,
    sum(cost) AS cost,
    countIf(priced = 0) AS unpriced_requests
FROM usage_priced
GROUP BY tenant, model, month, currency;

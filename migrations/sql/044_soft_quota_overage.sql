-- Overage of soft quotas: usage above the limit that a soft quota let
-- through and finance bills. One row per tenant x model x quota x period
-- whose last counter (the highest version: the aggregator's, or the
-- reconciler's repair) exceeded its limit. Period bounds are in the
-- tenant's time zone, as the aggregator keeps them.
CREATE VIEW IF NOT EXISTS soft_quota_overage AS
SELECT
    tenant,
    model,
    quota,
    period,
    period_start,
    period_end,
    unit,
    used,
    quota_limit,
    used - quota_limit AS overage
FROM quota_state FINAL
WHERE mode = 'soft' AND quota_limit > 0 AND used > quota_limit;

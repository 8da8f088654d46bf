-- Every signal published on sluice.signals.v1, for audit and dashboards.
-- Signal ids are deterministic, so a replay re-writes the same rows and
-- ReplacingMergeTree folds them together.
CREATE TABLE IF NOT EXISTS signals_log
(
    id                   String,
    kind                 String,
    time                 DateTime,
    tenant               String,
    model                String,
    quota                String,
    period               String,
    period_start         DateTime,
    tier                 UInt16,
    previous_tier        UInt16,
    used                 Float64,
    quota_limit          Float64,
    rate_per_minute      Float64,
    predicted_exhaustion DateTime,
    reason               String,
    payload              String
)
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (tenant, kind, time, id);

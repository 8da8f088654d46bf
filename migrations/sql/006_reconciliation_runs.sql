-- One row per tenant x model x quota x period checked by a reconciliation
-- run: the counter the aggregator kept, the truth recomputed from distinct
-- event ids, the drift, and whether it was repaired.
CREATE TABLE IF NOT EXISTS reconciliation_runs
(
    run_id       String,
    started_at   DateTime,
    tenant       String,
    model        String,
    quota        String,
    period       String,
    period_start DateTime,
    counter      Float64,
    truth        Float64,
    drift        Float64,
    repaired     UInt8
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(started_at)
ORDER BY (run_id, tenant, model, quota, period_start);

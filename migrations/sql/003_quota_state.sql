-- Usage against each quota of the policy, per tenant x model x quota x
-- period, as the aggregator last computed it (absolute values, highest
-- version wins, as in usage_minute). The reconciler compares `used` with the
-- raw events and repairs it by writing a higher version.
CREATE TABLE IF NOT EXISTS quota_state
(
    tenant               String,
    model                String,
    quota                String,
    period               String,
    period_start         DateTime,
    period_end           DateTime,
    used                 Float64,
    quota_limit          Float64,
    unit                 String,
    mode                 String,
    tier                 UInt16,
    rate_per_minute      Float64,
    predicted_exhaustion DateTime,
    version              UInt64,
    updated_at           DateTime
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(period_start)
ORDER BY (tenant, model, quota, period_start);

-- Every tier crossing, up or down, as emitted in a tier_crossed signal.
CREATE TABLE IF NOT EXISTS tier_transitions
(
    signal_id     String,
    time          DateTime,
    tenant        String,
    model         String,
    quota         String,
    period        String,
    period_start  DateTime,
    previous_tier UInt16,
    tier          UInt16,
    direction     String,
    used          Float64,
    quota_limit   Float64
)
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (tenant, time, signal_id);

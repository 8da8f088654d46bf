-- Per-minute rollups by tenant x model, written by the aggregator.
--
-- The aggregator writes each minute's absolute totals, not deltas, with a
-- version that grows with the Kafka offset it covers. ReplacingMergeTree
-- keeps the highest version, so re-writing a minute after a crash or a
-- partition move replaces it instead of double counting. Read with FINAL
-- (or argMax by version) for exact figures. model '*' is the tenant-wide row.
CREATE TABLE IF NOT EXISTS usage_minute
(
    tenant            String,
    model             String,
    minute            DateTime,
    requests          UInt64,
    prompt_tokens     UInt64,
    completion_tokens UInt64,
    cached_tokens     UInt64,
    errors            UInt64,
    slow_calls        UInt64,
    cost              Float64,
    version           UInt64,
    updated_at        DateTime
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(minute)
ORDER BY (tenant, model, minute);

-- Raw usage events: the billing ground truth.
--
-- Dedup by id: ReplacingMergeTree keeps one row per (tenant, id) within a
-- day partition; an event and its retries have the same id and time, so they
-- always meet in the same partition. The version column is the Kafka offset:
-- an estimated event (estimated = 1) is settled by a later event with the
-- same id, which has a higher offset on the tenant's partition and wins.
-- Reads that must be exact use FINAL or argMax(..., kafka_offset) by id.
--
-- kafka_partition and kafka_offset let a restarted aggregator find the
-- highest offset already stored per partition and resume after it.
-- time is second precision (DateTime64 does not exist on 18.16); time_ms
-- keeps the milliseconds.
CREATE TABLE IF NOT EXISTS usage_events
(
    id                String,
    time              DateTime,
    time_ms           UInt16,
    tenant            String,
    model             String,
    prompt_tokens     UInt64,
    completion_tokens UInt64,
    cached_tokens     UInt64,
    user              String,
    api_key_id        String,
    provider          String,
    endpoint          String,
    status            UInt16,
    outcome           String,
    latency_ms        UInt32,
    priority          String,
    session_id        String,
    estimated         UInt8,
    gateway           String,
    attribute_keys    Array(String),
    attribute_values  Array(String),
    kafka_partition   Int32,
    kafka_offset      Int64,
    ingested_at       DateTime
)
ENGINE = ReplacingMergeTree(kafka_offset)
PARTITION BY toYYYYMMDD(time)
ORDER BY (tenant, id);

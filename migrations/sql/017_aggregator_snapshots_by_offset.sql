-- aggregator_snapshots again, now partitioned by (kafka_partition,
-- kafka_offset): every snapshot is a ClickHouse partition of its own, so
-- the aggregator deletes a superseded snapshot with ALTER TABLE ... DROP
-- PARTITION, which removes its parts at once on ClickHouse 18.16 and
-- current ClickHouse alike. A DELETE mutation (016's table, unpartitioned)
-- would rewrite every part of the table, newest snapshot included, for
-- each cleanup: hundreds of megabytes per million tenant x model keys.
-- One insert carries one snapshot, so a snapshot is one part that is
-- never merged with another. Snapshots stored under 016 are dropped with
-- the old table: they were off by default, and a restart without one
-- rebuilds in full from the events.
DROP TABLE IF EXISTS aggregator_snapshots;
CREATE TABLE IF NOT EXISTS aggregator_snapshots
(
    kafka_partition Int32,
    kafka_offset    Int64,
    format          UInt16,
    fingerprint     String,
    chunk           UInt32,
    chunks          UInt32,
    data            String,
    taken_at        DateTime
)
ENGINE = ReplacingMergeTree()
PARTITION BY (kafka_partition, kafka_offset)
ORDER BY chunk;

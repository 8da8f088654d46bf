-- Snapshots of the aggregator's per-partition state (tally.Partition's
-- Snapshot), so that a restart loads the state and replays only the events
-- stored after it instead of a month and a half of them. A snapshot covers
-- the events of kafka_partition below kafka_offset; it is cut into chunks
-- (a million tenant x model keys take ~540 MB) and is usable only when
-- all `chunks` of it are stored. format is tally.SnapshotVersion and
-- fingerprint the policy's: a restart ignores snapshots of another format
-- or policy and rebuilds in full. Dropping snapshots older than the
-- newest is left to the aggregator (no TTL on ClickHouse 18.16).
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
ORDER BY (kafka_partition, kafka_offset, chunk);

-- Every admin action (breaker trip/reset, blacklist, quota override):
-- who did what, to whom, when and why. Append-only.
CREATE TABLE IF NOT EXISTS admin_audit
(
    time       DateTime,
    actor      String,
    action     String,
    tenant     String,
    model      String,
    api_key_id String,
    reason     String,
    expires_at DateTime,
    details    String,
    request_id String
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (time, tenant);

-- quota_state carries the period's token types beside `used`: cache reads,
-- cache writes and reasoning tokens (migration 050), parts of the
-- period's prompt and completion tokens, counted by the aggregator for
-- the quota's model key and period and written with each row. A row
-- written before these columns existed, or by a reconciler repair of a
-- request quota, reads 0.
ALTER TABLE quota_state ADD COLUMN cached_tokens UInt64 DEFAULT 0 AFTER used;
ALTER TABLE quota_state ADD COLUMN cache_write_tokens UInt64 DEFAULT 0 AFTER cached_tokens;
ALTER TABLE quota_state ADD COLUMN reasoning_tokens UInt64 DEFAULT 0 AFTER cache_write_tokens;
-- 18.16 has no ADD COLUMN IF NOT EXISTS: the migrator (and chdb_check.py)
-- skip a one-column ADD COLUMN whose column already exists.

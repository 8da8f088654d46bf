-- The aggregator's minute rollups carry the token types usage events do
-- (migration 050): cache writes beside the cache reads (cached_tokens),
-- and reasoning. Like cached_tokens they are parts of prompt_tokens and
-- completion_tokens, never additions. Rows written before these columns
-- existed read as 0; the reconciler's audit compares and repairs them
-- like the other counts.
ALTER TABLE usage_minute ADD COLUMN cache_write_tokens UInt64 DEFAULT 0 AFTER cached_tokens;
ALTER TABLE usage_minute ADD COLUMN reasoning_tokens UInt64 DEFAULT 0 AFTER cache_write_tokens;
-- 18.16 has no ADD COLUMN IF NOT EXISTS: the migrator (and chdb_check.py)
-- skip a one-column ADD COLUMN whose column already exists.

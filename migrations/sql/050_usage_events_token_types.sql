-- Token types the providers price apart (usage event v1's optional
-- cache_write_tokens and reasoning_tokens). Like cached_tokens (the cache
-- read), they are parts of prompt_tokens and completion_tokens, never
-- additions: every sum of prompt_tokens + completion_tokens, and every
-- quota counted from it, is unchanged by them. Rows stored before these
-- columns existed read as 0.
ALTER TABLE usage_events ADD COLUMN cache_write_tokens UInt64 DEFAULT 0 AFTER cached_tokens;
ALTER TABLE usage_events ADD COLUMN reasoning_tokens UInt64 DEFAULT 0 AFTER cache_write_tokens;
-- 18.16 has no ADD COLUMN IF NOT EXISTS: the migrator (and chdb_check.py)
-- skip a one-column ADD COLUMN whose column already exists.

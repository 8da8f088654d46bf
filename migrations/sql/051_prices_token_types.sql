-- Prices of the token types usage event v1 counts apart (migration 050):
-- cache writes and reasoning. A row stored before these columns existed
-- had no such price, and the provider then billed cache writes as input
-- and reasoning as output: so they default to the row's prompt and
-- completion prices, and old rows keep the cost they had.
-- pricetable.Sync re-inserts a policy entry whose figures differ, with a
-- later inserted_at, which price_periods prefers.
ALTER TABLE prices ADD COLUMN cache_write_per_million Float64 DEFAULT prompt_per_million AFTER cached_per_million;
ALTER TABLE prices ADD COLUMN reasoning_per_million Float64 DEFAULT completion_per_million AFTER cache_write_per_million;
-- 18.16 has no ADD COLUMN IF NOT EXISTS: the migrator (and chdb_check.py)
-- skip a one-column ADD COLUMN whose column already exists.

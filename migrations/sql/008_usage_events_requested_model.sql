-- requested_model: the model a caller asked for when a cheaper fallback
-- served the request (usage event v1's optional requested_model). model
-- stays the model that served, which is what every counter and every cost
-- view (usage_priced and the reports on it) counts and prices; requested
-- model is '' for the usual request served by the model it asked for.
-- Rows stored before this column existed read as ''.
ALTER TABLE usage_events ADD COLUMN requested_model String DEFAULT '' AFTER gateway;
-- 18.16 has no ADD COLUMN IF NOT EXISTS: the migrator (and chdb_check.py)
-- skip a one-column ADD COLUMN whose column already exists.

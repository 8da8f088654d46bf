-- Model prices per million tokens with the date they take effect. A price
-- change is a new row, never an update, so cost computed for past usage
-- never changes: a report joins each event with the latest price whose
-- effective_from is not after the event. inserted_at lets a mistaken row
-- be corrected by re-inserting the same (model, effective_from).
CREATE TABLE IF NOT EXISTS prices
(
    model                  String,
    currency               String,
    effective_from         DateTime,
    prompt_per_million     Float64,
    completion_per_million Float64,
    cached_per_million     Float64,
    note                   String,
    inserted_at            DateTime
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (model, effective_from);

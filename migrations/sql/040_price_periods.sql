-- Price periods: one row per model and price entry with the instant the
-- next entry for the same model takes over (effective_to, exclusive; far
-- future for the current price). Reports join an event with the one period
-- that contains its time, which gives "the latest price whose
-- effective_from is not after the event" on ClickHouse 18.16, which has no
-- ASOF JOIN. A corrected entry (same model and effective_from, later
-- inserted_at) replaces the old one here without waiting for a merge.
CREATE VIEW IF NOT EXISTS price_periods AS
SELECT
    model,
    tupleElement(p, 1) AS effective_from,
    tupleElement(p, 2) AS effective_to,
    tupleElement(p, 3) AS currency,
    tupleElement(p, 4) AS prompt_per_million,
    tupleElement(p, 5) AS completion_per_million,
    tupleElement(p, 6) AS cached_per_million
FROM
(
    SELECT
        model,
        arraySort(x -> tupleElement(x, 1), groupArray((effective_from, currency, prompt, completion, cached))) AS sorted,
        arrayMap(x -> tupleElement(x, 1), sorted) AS froms,
        arrayPushBack(arraySlice(froms, 2), toDateTime('2105-12-31 00:00:00', 'UTC')) AS tos,
        arrayMap((x, t) -> (tupleElement(x, 1), t, tupleElement(x, 2), tupleElement(x, 3), tupleElement(x, 4), tupleElement(x, 5)), sorted, tos) AS periods
    FROM
    (
        SELECT
            model,
            effective_from,
            argMax(currency, inserted_at) AS currency,
            argMax(prompt_per_million, inserted_at) AS prompt,
            argMax(completion_per_million, inserted_at) AS completion,
            argMax(cached_per_million, inserted_at) AS cached
        FROM prices
        GROUP BY model, effective_from
    )
    GROUP BY model
)
ARRAY JOIN periods AS p;

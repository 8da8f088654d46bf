-- The uncertainty of quota_state's predicted_exhaustion: the earliest and
-- latest plausible exhaustion (the epoch when there is none; a latest of
-- the epoch beside a prediction means "may well last the period") and what
-- the prediction rests on: 'rates' (the one- and five-minute rates of the
-- first minutes of traffic) or 'forecast' (the trend over completed
-- minutes). Rows written before this migration read as no range. One
-- column per statement: see migrations.addColumn.
ALTER TABLE quota_state ADD COLUMN predicted_earliest DateTime DEFAULT toDateTime(0) AFTER predicted_exhaustion;
ALTER TABLE quota_state ADD COLUMN predicted_latest DateTime DEFAULT toDateTime(0) AFTER predicted_earliest;
ALTER TABLE quota_state ADD COLUMN prediction_basis String DEFAULT '' AFTER predicted_latest;

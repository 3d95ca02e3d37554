-- +goose Up
-- The console charts retries, reclaims and republishes per time bucket
-- (issue 28) from the job history, which outlives the outbox's retention.
-- A retry is a record with verdict retry_scheduled and a reclaim one whose
-- delivery count is above 1; both were already there. A republish left no
-- record: the reconciler only counted it on the outbox row (republished),
-- with no time, and retention deletes the row. It now writes one row here
-- per republish, in the statement that hands the row back to the relay.
-- Kept for the host's HistoryRetention, like job_history. Plugin roles
-- hold no privilege on it.
CREATE TABLE job_republishes (
    id             bigserial   PRIMARY KEY,
    outbox_id      bigint      NOT NULL,
    job_id         text        NOT NULL,
    kind           text        NOT NULL,
    republished_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_republishes_at ON job_republishes (republished_at) INCLUDE (kind);

-- The chart's index-only scan also reads the delivery count now (a
-- reclaimed delivery is one above 1).
CREATE INDEX job_history_chart_deliveries ON job_history (finished_at) INCLUDE (kind, verdict, guard, started_at, deliveries);
DROP INDEX job_history_chart;
ALTER INDEX job_history_chart_deliveries RENAME TO job_history_chart;

-- +goose Down
CREATE INDEX job_history_chart_old ON job_history (finished_at) INCLUDE (kind, verdict, guard, started_at);
DROP INDEX job_history_chart;
ALTER INDEX job_history_chart_old RENAME TO job_history_chart;
DROP TABLE job_republishes;

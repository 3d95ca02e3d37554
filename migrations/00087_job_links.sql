-- +goose Up
-- A job's parent (the job whose handler enqueued it) is on its outbox row
-- (parent_job_id), which retention deletes while the job's history is
-- still kept: the console's request tree then went flat (issue 28). The
-- retainer now keeps each deleted row's link here, in the statement that
-- deletes it, off the job's path; it is trimmed with the history
-- (HistoryRetention). Plugin roles hold no privilege on it.
CREATE TABLE job_links (
    job_id        text        PRIMARY KEY,
    parent_job_id text        NOT NULL,
    kept_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_links_kept_at ON job_links (kept_at);

-- +goose Down
DROP TABLE job_links;

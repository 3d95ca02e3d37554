-- +goose Up
-- A duplicate that found an effect's claim held by another run retries
-- after the claim's lease (guard 2). waits_for names the claim row it
-- waits for (the host's key of the plugin's table and key values), so that
-- when the claim's owner marks it done, or gives it back after a failure,
-- the host moves the waiting retries to now instead of the lease's end.
ALTER TABLE scheduled_jobs ADD COLUMN waits_for text;
CREATE INDEX scheduled_jobs_waits_for ON scheduled_jobs (waits_for) WHERE waits_for IS NOT NULL AND enqueued_at IS NULL;

-- When each claim row was last freed (marked done or given back): a retry
-- scheduled after its run read the claim as held, but committed after the
-- owner's wake, reads it here and runs now. Both sides take the key's
-- advisory lock, so one always sees the other. A wake deletes up to two
-- rows older than a minute: the table holds the last minute's frees.
CREATE TABLE claim_wakes (
    waits_for text        PRIMARY KEY,
    at        timestamptz NOT NULL
);
CREATE INDEX claim_wakes_at ON claim_wakes (at);

-- +goose Down
DROP TABLE claim_wakes;
DROP INDEX scheduled_jobs_waits_for;
ALTER TABLE scheduled_jobs DROP COLUMN waits_for;

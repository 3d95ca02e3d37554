-- +goose Up
-- Retention (host/retention): the indexes its deletes and safety checks
-- use. processed_jobs is purged oldest first; before a job id is deleted,
-- the outbox rows, delayed runs and open dead letters that could carry it
-- back are looked up by that id.
CREATE INDEX processed_jobs_processed_at ON processed_jobs (processed_at);
CREATE INDEX outbox_job_id ON outbox (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX dead_letters_job_id ON dead_letters (job_id);

-- +goose Down
DROP INDEX dead_letters_job_id;
DROP INDEX outbox_job_id;
DROP INDEX processed_jobs_processed_at;

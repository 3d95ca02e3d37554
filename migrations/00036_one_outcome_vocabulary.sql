-- +goose Up
-- One vocabulary for how a delivery was settled (host/outcome): the job
-- history's verdicts take the outbox's spellings, so a retry is
-- retry_scheduled and a dead letter dead_letter wherever either is read.
UPDATE job_history SET verdict = 'retry_scheduled' WHERE verdict = 'retry';
UPDATE job_history SET verdict = 'dead_letter' WHERE verdict = 'dead_lettered';

-- +goose Down
UPDATE job_history SET verdict = 'retry' WHERE verdict = 'retry_scheduled';
UPDATE job_history SET verdict = 'dead_lettered' WHERE verdict = 'dead_letter';

-- +goose Up
-- Issue 28: the console and the CLI must read the same after outbox
-- retention, the history (not the outbox) being the source. Two facts
-- lived only on outbox rows:
--
-- A delivery's queue wait (commit to start) needs the job's commit time,
-- the outbox row's created_at: a history record now keeps it
-- (committed_at) once its row is gone. Retention's delete stamps the
-- records of the rows it deletes, in the same statement; while the row
-- is kept, the wait reads it from the row. Nothing on a job's path writes
-- it (no trigger: a lookup per record inserted would tax every delivery).
-- Only the runtime writes job_history (plugin roles hold no privilege on
-- it).
--
-- A job's state, attempts, kind, request and creation time, read from its
-- latest outbox row: retention deleted them while the job's history was
-- kept, so a job read "unknown" (an abandoned last delivery) and dropped
-- out of the jobs list and search. The statement that deletes the rows now
-- keeps them in job_links for every job (not only those with a parent),
-- trimmed with the history as before. Plugin roles hold no privilege on it.
ALTER TABLE job_history ADD COLUMN committed_at timestamptz;


-- What the job's deleted rows said: the latest one's kind, request,
-- outcome and created_at (last_row is its id), how many rows went and the
-- highest attempt they named. A job whose rows go in several passes
-- updates its link. Links kept before this migration (jobs with a parent)
-- get their kind and request from the history; their outcome stays
-- unknown (NULL).
ALTER TABLE job_links
    ALTER COLUMN parent_job_id DROP NOT NULL,
    ADD COLUMN kind       text,
    ADD COLUMN request_id text,
    ADD COLUMN outcome    text,
    ADD COLUMN created_at timestamptz,
    ADD COLUMN last_row   bigint,
    ADD COLUMN rows       integer NOT NULL DEFAULT 0,
    ADD COLUMN attempt    integer NOT NULL DEFAULT -1;
UPDATE job_links l SET kind = h.kind, request_id = h.request_id
    FROM (SELECT DISTINCT ON (job_id) job_id, kind, request_id FROM job_history ORDER BY job_id, id DESC) h
    WHERE h.job_id = l.job_id;

-- +goose Down
DELETE FROM job_links WHERE parent_job_id IS NULL;
ALTER TABLE job_links
    ALTER COLUMN parent_job_id SET NOT NULL,
    DROP COLUMN kind,
    DROP COLUMN request_id,
    DROP COLUMN outcome,
    DROP COLUMN created_at,
    DROP COLUMN last_row,
    DROP COLUMN rows,
    DROP COLUMN attempt;
ALTER TABLE job_history DROP COLUMN committed_at;

-- +goose Up
-- An operator's actions on one job (issue 28): cancel a job that has not
-- started, run a scheduled one now, discard a dead letter. Each is a
-- SECURITY DEFINER function nobody may call until an operator grants
-- EXECUTE (the runtime's owner, who `host` connects as, may); host/jobctl
-- calls them and records who acted in operator_actions, in the same
-- transaction.
--
-- A job is cancelled where it waits before any host can have it:
--   * a scheduled run (scheduled_jobs, not yet due or not yet moved):
--     it is moved to the outbox already settled cancelled, so the
--     scheduler never enqueues it (both take the row FOR UPDATE);
--   * an outbox row not yet published: settled cancelled and taken out
--     of the relay's queue (published_at is set: no entry is ever added;
--     the relay takes its rows FOR UPDATE SKIP LOCKED, so a cancel waits
--     for a relay publishing the row and then sees it published).
-- A job whose entry is on the stream is refused: a host may be starting
-- it. Telling "not started" from "started" there would cost every job a
-- write before its handler runs (a start mark under the row's lock),
-- measured at 20-30 % of the counters' throughput (issue 28's note); a
-- workflow step pays it (usher_job_start, for steps only), a job does not.
-- A job cancelled before its first run frees its deduplication key.

ALTER TABLE outbox ADD COLUMN started_at timestamptz;

-- A discarded dead letter is kept (its job's history still shows it) but
-- is no longer open: nothing requeues it, no list counts it.
ALTER TABLE dead_letters ADD COLUMN discarded_at timestamptz;
ALTER TABLE dead_letters ADD COLUMN discard_reason text NOT NULL DEFAULT '';
DROP INDEX dead_letters_open;
CREATE INDEX dead_letters_open ON dead_letters (kind, id) WHERE requeued_at IS NULL AND discarded_at IS NULL;

-- +goose StatementBegin
-- Cancel job p_job_id (its identity: the first outbox row's id, or a
-- scheduled job's minted id) before any host has it. Returns where it
-- waited: 'scheduled' or 'pending' (not published); 'already' when it was
-- cancelled before (nothing changes). Raises, with the reason, for a job
-- that does not exist, is on the stream, ended, is dead-lettered, or is a
-- workflow's (cancel the workflow instead).
CREATE FUNCTION usher_cancel_job(p_job_id text, p_reason text DEFAULT '')
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_row_id bigint;
    s        scheduled_jobs%ROWTYPE;
    o        outbox%ROWTYPE;
BEGIN
    IF p_job_id IS NULL OR p_job_id = '' THEN
        RAISE EXCEPTION 'usher_cancel_job: name the job' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(p_reason) > 2048 THEN
        RAISE EXCEPTION 'usher_cancel_job: a reason of % bytes is over the 2048-byte limit', octet_length(p_reason)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF EXISTS (SELECT 1 FROM workflow_steps WHERE job_id = p_job_id) THEN
        RAISE EXCEPTION 'job % is a workflow step: cancel its workflow (host workflows cancel), which cancels the steps not started', p_job_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF EXISTS (SELECT 1 FROM dead_letters WHERE job_id = p_job_id AND requeued_at IS NULL AND discarded_at IS NULL) THEN
        RAISE EXCEPTION 'job % is dead-lettered: nothing runs it; discard its dead letter (host deadletters discard) to close it', p_job_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- A scheduled run first: the scheduler takes it FOR UPDATE SKIP
    -- LOCKED, so this waits for a move in progress and then sees it moved.
    SELECT * INTO s FROM scheduled_jobs WHERE job_id = p_job_id AND enqueued_at IS NULL
        ORDER BY attempt DESC LIMIT 1 FOR UPDATE;
    IF FOUND THEN
        UPDATE scheduled_jobs SET enqueued_at = now() WHERE job_id = s.job_id AND attempt = s.attempt;
        INSERT INTO outbox (kind, payload, request_id, trace, job_id, attempt, published_at, done_at, outcome)
            VALUES (s.kind, s.payload, s.request_id, s.trace, s.job_id, s.attempt, now(), now(), 'cancelled');
        RETURN 'scheduled';
    END IF;
    v_row_id := CASE WHEN p_job_id ~ '^[0-9]{1,18}$' THEN p_job_id::bigint END;
    SELECT * INTO o FROM outbox WHERE job_id = p_job_id OR (job_id IS NULL AND id = v_row_id)
        ORDER BY id DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job %: no outbox row or scheduled run names it', p_job_id
            USING ERRCODE = 'no_data_found';
    END IF;
    IF o.kind LIKE 'usher.workflow.%' OR o.workflow IS NOT NULL THEN
        RAISE EXCEPTION 'job % is a workflow''s %: cancel the workflow (host workflows cancel)', p_job_id, o.kind
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF o.outcome = 'cancelled' THEN
        RETURN 'already';
    END IF;
    IF o.done_at IS NOT NULL THEN
        RAISE EXCEPTION 'job % has ended (%): there is nothing left to cancel', p_job_id, o.outcome
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF o.published_at IS NOT NULL THEN
        RAISE EXCEPTION 'job % is on the stream (published at %): a host may have started it, and a run finishes under its guard; to hold its delivery, pause its kind (host kinds pause %)', p_job_id, o.published_at, o.kind
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE outbox SET done_at = now(), outcome = 'cancelled', published_at = now()
        WHERE id = o.id;
    -- A cancelled job holds no deduplication key: the same key enqueues
    -- again (as River's unique jobs leave cancelled ones out).
    DELETE FROM job_dedup_keys WHERE kind = o.kind AND outbox_id = v_row_id;
    RETURN 'pending';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Make job p_job_id's scheduled run due now. Returns when it was due.
-- Raises for a job with no scheduled run waiting.
CREATE FUNCTION usher_run_job_now(p_job_id text)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_was timestamptz;
BEGIN
    IF p_job_id IS NULL OR p_job_id = '' THEN
        RAISE EXCEPTION 'usher_run_job_now: name the job' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT run_at INTO v_was FROM scheduled_jobs WHERE job_id = p_job_id AND enqueued_at IS NULL
        ORDER BY attempt DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % has no scheduled run waiting: only a scheduled job (waiting to retry, or scheduled for later) can run now', p_job_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE scheduled_jobs SET run_at = least(run_at, now()) WHERE job_id = p_job_id AND enqueued_at IS NULL;
    RETURN v_was;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Discard open dead letter p_id: kept, with why, and no longer open.
-- Returns its job's id. Raises for a letter that is not open.
CREATE FUNCTION usher_discard_dead_letter(p_id bigint, p_reason text DEFAULT '')
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    d dead_letters%ROWTYPE;
BEGIN
    IF octet_length(p_reason) > 2048 THEN
        RAISE EXCEPTION 'usher_discard_dead_letter: a reason of % bytes is over the 2048-byte limit', octet_length(p_reason)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    SELECT * INTO d FROM dead_letters WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no dead letter %', p_id USING ERRCODE = 'no_data_found';
    END IF;
    IF d.requeued_at IS NOT NULL THEN
        RAISE EXCEPTION 'dead letter % was requeued at %: it is not open', p_id, d.requeued_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF d.discarded_at IS NOT NULL THEN
        RAISE EXCEPTION 'dead letter % was discarded at %', p_id, d.discarded_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE dead_letters SET discarded_at = now(), discard_reason = coalesce(p_reason, '') WHERE id = p_id;
    RETURN d.job_id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A host is about to run the delivery of outbox row p_outbox_id (job
-- p_job_id, a workflow step when p_step): false when the job or the step
-- was cancelled before it started (the host settles the delivery as
-- cancelled and runs nothing), true otherwise, and from here on a cancel
-- leaves it to finish. A row retention trimmed (an old duplicate) runs:
-- its guard absorbs it.
CREATE FUNCTION usher_job_start(p_outbox_id bigint, p_job_id text, p_step boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_outcome text;
BEGIN
    UPDATE outbox SET started_at = coalesce(started_at, now()) WHERE id = p_outbox_id
        RETURNING outcome INTO v_outcome;
    IF v_outcome = 'cancelled' THEN
        RETURN false;
    END IF;
    IF p_step THEN
        RETURN usher_workflow_step_start(p_job_id);
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- usher_job_start for the deliveries a host is about to run at once (one
-- round trip for all of them), answered in the order given. The rows are
-- taken in outbox id order, so two hosts' batches lock them in one order.
CREATE FUNCTION usher_jobs_start(p_outbox_ids bigint[], p_job_ids text[], p_steps boolean[])
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    v_run boolean[] := array_fill(true, ARRAY[coalesce(array_length(p_outbox_ids, 1), 0)]);
    i     bigint;
BEGIN
    FOR i IN SELECT u.n FROM unnest(p_outbox_ids) WITH ORDINALITY AS u(id, n) ORDER BY u.id, u.n LOOP
        v_run[i] := usher_job_start(p_outbox_ids[i], p_job_ids[i], p_steps[i]);
    END LOOP;
    RETURN v_run;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_cancel_job(text, text)', 'usher_run_job_now(text)',
                             'usher_discard_dead_letter(bigint, text)', 'usher_job_start(bigint, text, boolean)',
                             'usher_jobs_start(bigint[], text[], boolean[])'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION usher_jobs_start(bigint[], text[], boolean[]);
DROP FUNCTION usher_job_start(bigint, text, boolean);
DROP FUNCTION usher_discard_dead_letter(bigint, text);
DROP FUNCTION usher_run_job_now(text);
DROP FUNCTION usher_cancel_job(text, text);
DROP INDEX dead_letters_open;
CREATE INDEX dead_letters_open ON dead_letters (kind, id) WHERE requeued_at IS NULL;
ALTER TABLE dead_letters DROP COLUMN discard_reason;
ALTER TABLE dead_letters DROP COLUMN discarded_at;
ALTER TABLE outbox DROP COLUMN started_at;

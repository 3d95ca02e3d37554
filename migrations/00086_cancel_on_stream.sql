-- +goose Up
-- Cancel a job whose entry is on the stream (issue 28), without a write or
-- a query per job: the cancel of a published job is a request, kept here;
-- every host holds the requests in memory (jobctl.CancelWatcher: read at
-- start, again on the NOTIFY below and every second) and settles a
-- delivery of a requested job as cancelled, and acks it, instead of
-- running it. Deciding "not started" exactly would cost every job a start
-- write under its row's lock (usher_job_start, 20-30 % of the counters'
-- throughput; a workflow step pays it), so this is not exact: a host that
-- started the job before the request reached it lets the run finish under
-- its guard, and the job's outcome says applied. `host jobs show` tells
-- which happened. The other cases are as 00083 made them: a scheduled run
-- or an unpublished row is cancelled for good under its row's lock, and a
-- workflow's job, a dead letter, an ended job are refused.
--
-- A request stands while its job may still be delivered: it is read by
-- the hosts until its job ends otherwise (applied, absorbed,
-- dead-lettered: a duplicate of an applied job is its guard's to absorb,
-- a requeued dead letter runs), and is kept after its job was settled
-- cancelled, because a redelivery of that entry (an ack lost, a relay
-- duplicate) must not run it either. Retention (--outbox-retention)
-- deletes a request once no outbox row or delayed run of its job is live,
-- as it does processed job ids.
CREATE TABLE job_cancels (
    job_id       text        PRIMARY KEY,
    -- The job's latest outbox row when the cancel was asked.
    outbox_id    bigint      NOT NULL,
    kind         text        NOT NULL,
    reason       text        NOT NULL DEFAULT '',
    requested_at timestamptz NOT NULL DEFAULT now()
);

-- +goose StatementBegin
-- Cancel job p_job_id (its identity: the first outbox row's id, or a
-- scheduled job's minted id) before any host has started it. Returns
-- where it waited: 'scheduled', 'pending' (not published) or 'stream' (on
-- the stream: recorded in job_cancels and notified on usher_job_cancels,
-- so no host starts it from then on, while a run a host started before
-- finishes under its guard); 'already' when it was cancelled before
-- (nothing changes). Raises, with the reason, for a job that does not
-- exist, has started (a workflow step's start mark), ended, is
-- dead-lettered, or is a workflow's (cancel the workflow instead).
CREATE OR REPLACE FUNCTION usher_cancel_job(p_job_id text, p_reason text DEFAULT '')
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_row_id bigint;
    v_job    text;
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
        IF o.started_at IS NOT NULL THEN
            RAISE EXCEPTION 'job % has started (at %): a run finishes under its guard; there is nothing left to cancel', p_job_id, o.started_at
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        -- The job's identity as the hosts read it from the entry (a
        -- job named '042' is job 42).
        v_job := coalesce(o.job_id, o.id::text);
        -- A request made for an earlier row of the job (before a retry,
        -- or before its dead letter was requeued) is made again for this
        -- one; a request for this row stands already.
        INSERT INTO job_cancels AS c (job_id, outbox_id, kind, reason) VALUES (v_job, o.id, o.kind, coalesce(p_reason, ''))
            ON CONFLICT (job_id) DO UPDATE SET outbox_id = EXCLUDED.outbox_id, reason = EXCLUDED.reason, requested_at = now()
                WHERE c.outbox_id < EXCLUDED.outbox_id;
        IF NOT FOUND THEN
            RETURN 'already';
        END IF;
        -- Delivered at commit: every host's watcher reads the requests again.
        PERFORM pg_notify('usher_job_cancels', v_job);
        RETURN 'stream';
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
-- A host settles outbox row p_outbox_id (job p_job_id, of kind p_kind)
-- cancelled without running it: a cancel asked while its entry was on the
-- stream (job_cancels) reached the host first. Only a row with no outcome
-- yet is marked, and then the job's deduplication key is freed; a row
-- that has one keeps it (a duplicate delivery of a job that applied
-- before the cancel came). Returns the row's outcome before: NULL when
-- this marked it, '' when no row is left (retention trimmed it).
CREATE FUNCTION usher_settle_cancel(p_outbox_id bigint, p_job_id text, p_kind text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_done    timestamptz;
    v_outcome text;
BEGIN
    SELECT done_at, outcome INTO v_done, v_outcome FROM outbox WHERE id = p_outbox_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN '';
    END IF;
    IF v_done IS NOT NULL THEN
        RETURN coalesce(v_outcome, '');
    END IF;
    UPDATE outbox SET done_at = now(), outcome = 'cancelled' WHERE id = p_outbox_id;
    DELETE FROM job_dedup_keys WHERE kind = p_kind
        AND outbox_id = CASE WHEN p_job_id ~ '^[0-9]{1,18}$' THEN p_job_id::bigint END;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_cancel_job(text, text)', 'usher_settle_cancel(bigint, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION usher_settle_cancel(bigint, text, text);

-- +goose StatementBegin
-- usher_cancel_job as 00083 made it: a job on the stream is refused.
CREATE OR REPLACE FUNCTION usher_cancel_job(p_job_id text, p_reason text DEFAULT '')
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
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_cancel_job(text, text) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd

DROP TABLE job_cancels;

-- +goose Up
-- Durable workflows (issue 27). A workflow's state lives here, in the
-- runtime's tables; Redis only carries its deliveries. Every event is a row
-- of workflow_events, numbered per workflow; an event that needs a decision
-- (started, a step finished, a timer fired, a signal, a cancel request)
-- enqueues one decision task, an outbox row of the internal kind
-- usher.workflow.<type>, when none is outstanding. The host answers a task
-- by sending the history to the plugin serving the type and committing the
-- decision (steps as outbox rows, timers, the result) in one transaction
-- that records it in workflow_decisions, keyed (workflow, last event seen).
--
-- No plugin role has any privilege on these tables (sandbox.RuntimeTables).
-- Applications reach them only through usher_start_workflow,
-- usher_signal_workflow and usher_cancel_workflow, SECURITY DEFINER, which
-- nobody may call until an operator grants EXECUTE (like usher_enqueue_job).
-- The limits are internal/wfmsg's; the functions check them again for
-- callers in other languages.

CREATE TABLE workflows (
    id             bigserial   PRIMARY KEY,
    type           text        NOT NULL,
    workflow_id    text        NOT NULL,
    state          text        NOT NULL DEFAULT 'running'
                               CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
    input          jsonb       NOT NULL,
    result         jsonb,
    error          text,
    -- The plugin and version that took the workflow's first decision.
    plugin         text,
    plugin_version text,
    -- Every task, step and decision of the workflow carries these.
    request_id     text        NOT NULL,
    trace          text        NOT NULL,
    -- The last event's number; the last event a committed decision saw.
    last_seq       bigint      NOT NULL DEFAULT 0,
    decided_seq    bigint      NOT NULL DEFAULT 0,
    -- The job id of the outstanding decision task (its outbox id), NULL
    -- when none is: a task whose job id is not this one is not the
    -- workflow's to decide.
    task_job       text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    UNIQUE (type, workflow_id)
);
CREATE INDEX workflows_listed ON workflows (state, type, created_at);
CREATE INDEX workflows_task ON workflows (task_job) WHERE task_job IS NOT NULL;

CREATE TABLE workflow_events (
    workflow bigint      NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    seq      bigint      NOT NULL,
    type     text        NOT NULL CHECK (type IN ('started', 'step_scheduled', 'step_completed', 'step_failed',
                                                  'timer_set', 'timer_fired', 'signal_received', 'cancel_requested',
                                                  'completed', 'failed', 'cancelled')),
    name     text        NOT NULL DEFAULT '',
    detail   text        NOT NULL DEFAULT '',
    data     jsonb,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow, seq)
);

-- A step is a job of its own kind (its own guard): job_id is its identity
-- (the outbox id, kept by its retries), so the job's final outcome finds it.
CREATE TABLE workflow_steps (
    workflow      bigint      NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step          text        NOT NULL,
    kind          text        NOT NULL,
    job_id        text        NOT NULL UNIQUE,
    state         text        NOT NULL DEFAULT 'scheduled' CHECK (state IN ('scheduled', 'completed', 'failed')),
    scheduled_seq bigint      NOT NULL,
    -- What the step's handler returned (usher_workflow_step_result), in
    -- the step_completed event's data once its job applied.
    result        jsonb,
    finished_at   timestamptz,
    PRIMARY KEY (workflow, step)
);

CREATE TABLE workflow_timers (
    workflow bigint      NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    name     text        NOT NULL,
    fire_at  timestamptz NOT NULL,
    fired_at timestamptz,
    set_seq  bigint      NOT NULL,
    PRIMARY KEY (workflow, name)
);
CREATE INDEX workflow_timers_due ON workflow_timers (fire_at) WHERE fired_at IS NULL;

CREATE TABLE workflow_signals (
    workflow    bigint      NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    signal_id   text        NOT NULL,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL,
    seq         bigint      NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow, signal_id)
);

-- One row per decision committed: the key that absorbs a redelivered task.
CREATE TABLE workflow_decisions (
    workflow       bigint      NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    seq            bigint      NOT NULL,
    task_job       text        NOT NULL,
    plugin         text        NOT NULL,
    plugin_version text        NOT NULL,
    steps          integer     NOT NULL,
    timers         integer     NOT NULL,
    finish         text        NOT NULL DEFAULT '',
    decided_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow, seq)
);
CREATE INDEX workflow_decisions_task ON workflow_decisions (task_job);

-- The workflow an outbox row belongs to: its decision tasks and its steps'
-- first runs. NULL for every other job.
ALTER TABLE outbox ADD COLUMN workflow bigint;

-- +goose StatementBegin
-- A new W3C traceparent, as client.Enqueue and usher_enqueue_job make.
CREATE FUNCTION usher_workflow_traceparent() RETURNS text LANGUAGE sql AS $$
    SELECT '00-' || replace(gen_random_uuid()::text, '-', '') || '-'
           || left(replace(gen_random_uuid()::text, '-', ''), 16) || '-01'
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Whether an event of type p_type needs a decision: the one list, which
-- the host's decision reads too (host/workflow).
CREATE FUNCTION usher_workflow_wakes(p_type text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_type IN ('started', 'step_completed', 'step_failed', 'timer_fired', 'signal_received', 'cancel_requested')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Enqueue workflow p_workflow's decision task unless one is outstanding.
-- The caller holds the workflow's row lock.
CREATE FUNCTION usher_workflow_wake(p_workflow bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    w     record;
    v_out bigint;
BEGIN
    SELECT type, state, task_job, last_seq, request_id, trace INTO w FROM workflows WHERE workflows.id = p_workflow;
    IF w.task_job IS NOT NULL OR w.state <> 'running' THEN
        RETURN;
    END IF;
    INSERT INTO outbox (kind, payload, request_id, trace, workflow)
        VALUES ('usher.workflow.' || w.type, jsonb_build_object('workflow', p_workflow, 'seq', w.last_seq),
                w.request_id, w.trace, p_workflow)
        RETURNING outbox.id INTO v_out;
    UPDATE workflows SET task_job = v_out::text WHERE workflows.id = p_workflow;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Record an event of workflow p_workflow (whose row lock the caller holds
-- or takes here) and return its number. An event that needs a decision
-- wakes the workflow. A running workflow whose history reaches 10000
-- events fails, with the limit as its error: the decision path refuses a
-- decision that would reach it, and events from outside (a step's end, a
-- timer, a signal) are never lost, so they end the workflow instead.
CREATE FUNCTION usher_workflow_append(p_workflow bigint, p_type text, p_name text, p_detail text, p_data jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seq   bigint;
    v_state text;
BEGIN
    UPDATE workflows SET last_seq = last_seq + 1, updated_at = now() WHERE id = p_workflow
        RETURNING last_seq, state INTO v_seq, v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workflow %: no such workflow', p_workflow USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO workflow_events (workflow, seq, type, name, detail, data)
        VALUES (p_workflow, v_seq, p_type, coalesce(p_name, ''), coalesce(left(p_detail, 2048), ''), p_data);
    IF v_seq >= 10000 AND v_state = 'running' AND p_type NOT IN ('completed', 'failed', 'cancelled') THEN
        -- What happened is recorded; the workflow cannot go on.
        UPDATE workflows SET state = 'failed', task_job = NULL, finished_at = now(),
                             error = 'its history reached the 10000-event limit (wfmsg.MaxEvents)'
            WHERE id = p_workflow;
        PERFORM usher_workflow_append(p_workflow, 'failed', '', 'its history reached the 10000-event limit (wfmsg.MaxEvents)', NULL);
        RETURN v_seq;
    END IF;
    IF usher_workflow_wakes(p_type) THEN
        PERFORM usher_workflow_wake(p_workflow);
    END IF;
    RETURN v_seq;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Start workflow p_workflow_id of type p_type with p_input, in the caller's
-- transaction. Idempotent: an id that exists returns that workflow,
-- whatever its state, and its input is left as it was (started false).
CREATE FUNCTION usher_start_workflow(p_type text, p_workflow_id text, p_input jsonb)
RETURNS TABLE (id bigint, state text, started boolean) LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_type IS NULL OR p_type = '' OR octet_length(p_type) > 100 THEN
        RAISE EXCEPTION 'usher_start_workflow: a workflow type is 1 to 100 bytes (wfmsg.MaxTypeBytes)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workflow_id IS NULL OR p_workflow_id = '' OR octet_length(p_workflow_id) > 256 THEN
        RAISE EXCEPTION 'usher_start_workflow: a workflow id is 1 to 256 bytes (wfmsg.MaxIDBytes)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_input IS NULL THEN
        RAISE EXCEPTION 'usher_start_workflow: % workflow % has no input (pass ''{}'' or ''null''::jsonb for none)', p_type, p_workflow_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(p_input::text) > 262144 THEN
        RAISE EXCEPTION 'usher_start_workflow: % workflow % input of % bytes is over the 262144-byte limit (wfmsg.MaxInputBytes)',
            p_type, p_workflow_id, octet_length(p_input::text) USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO workflows (type, workflow_id, input, request_id, trace)
        VALUES (p_type, p_workflow_id, p_input, p_type || ':' || p_workflow_id, usher_workflow_traceparent())
        ON CONFLICT (type, workflow_id) DO NOTHING
        RETURNING workflows.id INTO v_id;
    IF v_id IS NOT NULL THEN
        PERFORM usher_workflow_append(v_id, 'started', '', '', p_input);
        RETURN QUERY SELECT v_id, 'running'::text, true;
        RETURN;
    END IF;
    RETURN QUERY SELECT w.id, w.state, false FROM workflows w WHERE w.type = p_type AND w.workflow_id = p_workflow_id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The running workflow (p_type, p_workflow_id), locked; what for names the
-- caller in the error an unknown or finished workflow gets.
CREATE FUNCTION usher_workflow_running(p_type text, p_workflow_id text, p_what text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    w record;
BEGIN
    SELECT id, state INTO w FROM workflows WHERE type = p_type AND workflow_id = p_workflow_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%: no % workflow %', p_what, p_type, p_workflow_id USING ERRCODE = 'no_data_found';
    END IF;
    IF w.state <> 'running' THEN
        RAISE EXCEPTION '%: % workflow % is %, not running', p_what, p_type, p_workflow_id, w.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN w.id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Signal a workflow from the caller's transaction. A signal id counts once:
-- sending it again returns false and records nothing, even once the
-- workflow has finished. A new signal to an unknown or finished workflow is
-- an error.
CREATE FUNCTION usher_signal_workflow(p_type text, p_workflow_id text, p_signal_id text, p_name text, p_payload jsonb)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id  bigint;
    v_seq bigint;
BEGIN
    IF p_signal_id IS NULL OR p_signal_id = '' OR octet_length(p_signal_id) > 256 THEN
        RAISE EXCEPTION 'usher_signal_workflow: a signal id is 1 to 256 bytes (wfmsg.MaxIDBytes)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name IS NULL OR p_name = '' OR octet_length(p_name) > 100 THEN
        RAISE EXCEPTION 'usher_signal_workflow: a signal name is 1 to 100 bytes (wfmsg.MaxTypeBytes)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_payload IS NULL THEN
        p_payload := 'null'::jsonb;
    END IF;
    IF octet_length(p_payload::text) > 65536 THEN
        RAISE EXCEPTION 'usher_signal_workflow: signal % payload of % bytes is over the 65536-byte limit (wfmsg.MaxSignalBytes)',
            p_name, octet_length(p_payload::text) USING ERRCODE = 'program_limit_exceeded';
    END IF;
    SELECT id INTO v_id FROM workflows WHERE type = p_type AND workflow_id = p_workflow_id;
    IF v_id IS NOT NULL AND EXISTS (SELECT 1 FROM workflow_signals WHERE workflow = v_id AND signal_id = p_signal_id) THEN
        RETURN false;
    END IF;
    v_id := usher_workflow_running(p_type, p_workflow_id, 'usher_signal_workflow');
    INSERT INTO workflow_signals (workflow, signal_id, name, payload, seq)
        VALUES (v_id, p_signal_id, p_name, p_payload, 0)
        ON CONFLICT (workflow, signal_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false; -- sent twice at once: the other counted
    END IF;
    v_seq := usher_workflow_append(v_id, 'signal_received', p_name, p_signal_id, p_payload);
    UPDATE workflow_signals SET seq = v_seq WHERE workflow = v_id AND signal_id = p_signal_id;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Ask a running workflow to cancel: its next decision sees
-- cancel_requested and decides (compensate, cancel). Asking again returns
-- false; an unknown or finished workflow is an error.
CREATE FUNCTION usher_cancel_workflow(p_type text, p_workflow_id text, p_reason text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
BEGIN
    v_id := usher_workflow_running(p_type, p_workflow_id, 'usher_cancel_workflow');
    IF EXISTS (SELECT 1 FROM workflow_events WHERE workflow = v_id AND type = 'cancel_requested') THEN
        RETURN false;
    END IF;
    PERFORM usher_workflow_append(v_id, 'cancel_requested', '', left(coalesce(p_reason, ''), 2048), NULL);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Fire up to p_limit due timers (host/workflow.Timers): each is marked
-- fired and, when its workflow still runs, recorded as timer_fired, which
-- wakes the workflow. SKIP LOCKED: hosts firing at once share the work.
CREATE FUNCTION usher_workflow_fire_timers(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    FOR t IN SELECT workflow, name FROM workflow_timers
             WHERE fired_at IS NULL AND fire_at <= now()
             ORDER BY fire_at LIMIT p_limit FOR UPDATE SKIP LOCKED LOOP
        UPDATE workflow_timers SET fired_at = now() WHERE workflow = t.workflow AND name = t.name;
        PERFORM 1 FROM workflows WHERE id = t.workflow AND state = 'running' FOR UPDATE;
        IF FOUND THEN
            PERFORM usher_workflow_append(t.workflow, 'timer_fired', t.name, '', NULL);
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A step's result, from its handler, in its job's own transaction (so it
-- commits with the effect, or not at all): the caller's role must serve
-- the job's kind (session_user, as usher_record_job checks), and the job
-- must be a workflow step still running. It returns false for a job that
-- is no running step (an ordinary job: nothing to record). A result over
-- 65536 bytes is refused.
CREATE FUNCTION usher_workflow_step_result(p_job_id text, p_kind text, p_result jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM usher_check_serves(p_kind);
    IF octet_length(p_result::text) > 65536 THEN
        RAISE EXCEPTION 'usher_workflow_step_result: % step result of % bytes is over the 65536-byte limit (wfmsg.MaxStepResultBytes)',
            p_kind, octet_length(p_result::text) USING ERRCODE = 'program_limit_exceeded';
    END IF;
    UPDATE workflow_steps SET result = p_result WHERE job_id = p_job_id AND kind = p_kind AND state = 'scheduled';
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A job's final outcome (applied, absorbed or dead_letter on its outbox row,
-- in the transaction that writes it): a workflow step's job records
-- step_completed or step_failed, atomically with that outcome; a decision
-- task dead-lettered (a decision refused, a plugin that never answers)
-- fails its workflow with the dead letter's reason.
CREATE FUNCTION usher_workflow_job_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_job    text := coalesce(NEW.job_id, NEW.id::text);
    v_wf     bigint;
    v_step   text;
    v_reason text;
    v_result jsonb;
BEGIN
    SELECT workflow INTO v_wf FROM workflow_steps WHERE job_id = v_job;
    IF FOUND THEN
        PERFORM 1 FROM workflows WHERE id = v_wf FOR UPDATE;
        UPDATE workflow_steps SET state = CASE WHEN NEW.outcome = 'dead_letter' THEN 'failed' ELSE 'completed' END,
                                  finished_at = now()
            WHERE job_id = v_job AND state = 'scheduled'
            RETURNING step, result INTO v_step, v_result;
        IF FOUND AND NEW.outcome = 'dead_letter' THEN
            SELECT left(reason || CASE WHEN last_error <> '' AND position(last_error IN reason) = 0 THEN ': ' || last_error ELSE '' END, 2048)
                INTO v_reason FROM dead_letters WHERE job_id = v_job ORDER BY id DESC LIMIT 1;
            PERFORM usher_workflow_append(v_wf, 'step_failed', v_step, coalesce(v_reason, 'dead-lettered'), NULL);
        ELSIF FOUND THEN
            PERFORM usher_workflow_append(v_wf, 'step_completed', v_step, NEW.outcome, v_result);
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.outcome = 'dead_letter' THEN
        SELECT id INTO v_wf FROM workflows WHERE task_job = v_job AND state = 'running' FOR UPDATE;
        IF FOUND THEN
            SELECT left(reason || CASE WHEN last_error <> '' AND position(last_error IN reason) = 0 THEN ': ' || last_error ELSE '' END, 2048)
                INTO v_reason FROM dead_letters WHERE job_id = v_job ORDER BY id DESC LIMIT 1;
            v_reason := 'its decision task was dead-lettered: ' || coalesce(v_reason, 'no reason recorded');
            UPDATE workflows SET state = 'failed', error = left(v_reason, 2048), task_job = NULL, finished_at = now()
                WHERE id = v_wf;
            PERFORM usher_workflow_append(v_wf, 'failed', '', v_reason, NULL);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Only rows that can be a workflow's (its tasks and steps' first runs carry
-- the workflow; a retry's row carries the job id): every other job's mark
-- pays the WHEN and nothing else.
CREATE TRIGGER outbox_workflow_job_done AFTER UPDATE OF done_at ON outbox
    FOR EACH ROW
    WHEN (OLD.done_at IS NULL AND NEW.done_at IS NOT NULL AND NEW.outcome IN ('applied', 'absorbed', 'dead_letter')
          AND (NEW.workflow IS NOT NULL OR NEW.job_id IS NOT NULL))
    EXECUTE FUNCTION usher_workflow_job_done();

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_workflow_traceparent()', 'usher_workflow_wakes(text)', 'usher_workflow_wake(bigint)',
                             'usher_workflow_append(bigint, text, text, text, jsonb)',
                             'usher_start_workflow(text, text, jsonb)', 'usher_workflow_running(text, text, text)',
                             'usher_signal_workflow(text, text, text, text, jsonb)', 'usher_cancel_workflow(text, text, text)',
                             'usher_workflow_job_done()', 'usher_workflow_fire_timers(integer)',
                             'usher_workflow_step_result(text, text, jsonb)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER outbox_workflow_job_done ON outbox;
DROP FUNCTION usher_workflow_job_done();
DROP FUNCTION usher_workflow_fire_timers(integer);
DROP FUNCTION usher_workflow_step_result(text, text, jsonb);
DROP FUNCTION usher_cancel_workflow(text, text, text);
DROP FUNCTION usher_signal_workflow(text, text, text, text, jsonb);
DROP FUNCTION usher_workflow_running(text, text, text);
DROP FUNCTION usher_start_workflow(text, text, jsonb);
DROP FUNCTION usher_workflow_append(bigint, text, text, text, jsonb);
DROP FUNCTION usher_workflow_wake(bigint);
DROP FUNCTION usher_workflow_wakes(text);
DROP FUNCTION usher_workflow_traceparent();
ALTER TABLE outbox DROP COLUMN workflow;
DROP TABLE workflow_decisions;
DROP TABLE workflow_signals;
DROP TABLE workflow_timers;
DROP TABLE workflow_steps;
DROP TABLE workflow_events;
DROP TABLE workflows;

-- +goose Up
-- A cancel stops the steps that have not started (issue 27, item 5).
-- Until now a cancel was only an event the workflow decided on: a step
-- already scheduled still ran after it, and after the workflow ended. Now
-- a step has started once a host has taken its first delivery to run
-- (usher_workflow_step_start, in its own transaction, before the handler
-- is called); a cancel asked of the workflow cancels each of its steps
-- that has not started, and a workflow that ends (any way) cancels every
-- one that has not, so nothing it scheduled starts after it. A started
-- step runs to its end, retries included, under its guard. Both take the
-- step's row lock, so either the start or the cancel comes first and the
-- other sees it: a step is never both cancelled and run.
--
-- A step the decision scheduled as detached (sdk.StepCall.Detached) is not
-- cancelled by a cancel request, only when its workflow ends: a checkout
-- that was paid renders and sends its tickets whatever is asked after.

ALTER TABLE workflow_steps ADD COLUMN started_at timestamptz;
ALTER TABLE workflow_steps ADD COLUMN detached boolean NOT NULL DEFAULT false;
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_state_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_state_check
    CHECK (state IN ('scheduled', 'completed', 'failed', 'cancelled'));

ALTER TABLE workflow_events DROP CONSTRAINT workflow_events_type_check;
ALTER TABLE workflow_events ADD CONSTRAINT workflow_events_type_check
    CHECK (type IN ('started', 'step_scheduled', 'step_completed', 'step_failed', 'step_cancelled',
                    'timer_set', 'timer_fired', 'signal_received', 'cancel_requested',
                    'completed', 'failed', 'cancelled', 'migrated'));

-- +goose StatementBegin
-- A step_cancelled event wakes its workflow (it is a step's end, like
-- step_completed): the decision that follows sees the step Cancelled.
CREATE OR REPLACE FUNCTION usher_workflow_wakes(p_type text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_type IN ('started', 'step_completed', 'step_failed', 'step_cancelled', 'timer_fired', 'signal_received',
                      'cancel_requested')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Cancel workflow p_id's steps that have not started (detached ones too
-- when p_all), each with its step_cancelled event. Children are steps
-- whose cancel is their own workflow's (usher_workflow_request_cancel).
-- The caller holds p_id's row lock.
CREATE FUNCTION usher_workflow_cancel_steps(p_id bigint, p_all boolean, p_why text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    n integer := 0;
BEGIN
    FOR s IN UPDATE workflow_steps SET state = 'cancelled', finished_at = now()
             WHERE workflow = p_id AND state = 'scheduled' AND started_at IS NULL
               AND (p_all OR NOT detached) AND job_id NOT LIKE 'child:%'
             RETURNING step LOOP
        PERFORM usher_workflow_append(p_id, 'step_cancelled', s, left(p_why, 2048), NULL);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A host is about to run job p_job_id, a workflow step's delivery: false
-- when the step was cancelled before it started (the host settles the
-- delivery as cancelled and runs nothing), true otherwise, and the step
-- counts as started from here on (a later cancel leaves it to finish). A
-- job that is no step (or a step that ended: a duplicate, which its
-- guard absorbs) is true.
CREATE FUNCTION usher_workflow_step_start(p_job_id text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
BEGIN
    UPDATE workflow_steps SET started_at = coalesce(started_at, now())
        WHERE job_id = p_job_id AND state = 'scheduled'
        RETURNING state INTO v_state;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT state INTO v_state FROM workflow_steps WHERE job_id = p_job_id;
    RETURN NOT FOUND OR v_state <> 'cancelled';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_workflow_request_cancel(p_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    c bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM workflow_events WHERE workflow = p_id AND type = 'cancel_requested') THEN
        RETURN false;
    END IF;
    PERFORM usher_workflow_append(p_id, 'cancel_requested', '', left(coalesce(p_reason, ''), 2048), NULL);
    PERFORM usher_workflow_cancel_steps(p_id, false, 'the workflow was asked to cancel before the step started');
    FOR c IN SELECT id FROM workflows WHERE parent = p_id AND state = 'running' ORDER BY id FOR UPDATE LOOP
        PERFORM usher_workflow_request_cancel(c, 'its parent was asked to cancel: ' || coalesce(p_reason, ''));
    END LOOP;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_workflow_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_step text;
    c      bigint;
BEGIN
    PERFORM usher_workflow_cancel_steps(NEW.id, true, 'the workflow ended ' || NEW.state || ' before the step started');
    IF NEW.parent IS NOT NULL THEN
        PERFORM 1 FROM workflows WHERE id = NEW.parent AND state = 'running' FOR UPDATE;
        IF FOUND THEN
            UPDATE workflow_steps SET state = CASE WHEN NEW.state = 'completed' THEN 'completed' ELSE 'failed' END,
                                      result = NEW.result, finished_at = now()
                WHERE job_id = 'child:' || NEW.id AND state = 'scheduled'
                RETURNING step INTO v_step;
            IF FOUND AND NEW.state = 'completed' THEN
                PERFORM usher_workflow_append(NEW.parent, 'step_completed', v_step, 'completed', NEW.result);
            ELSIF FOUND THEN
                PERFORM usher_workflow_append(NEW.parent, 'step_failed', v_step,
                    left(NEW.type || ' workflow ' || NEW.workflow_id || ' ' || NEW.state
                         || coalesce(': ' || nullif(NEW.error, ''), ''), 2048), NEW.result);
            END IF;
        END IF;
    END IF;
    FOR c IN SELECT id FROM workflows WHERE parent = NEW.id AND state = 'running' ORDER BY id FOR UPDATE LOOP
        PERFORM usher_workflow_request_cancel(c, 'its parent ' || NEW.type || ' workflow ' || NEW.workflow_id || ' ended ' || NEW.state);
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_workflow_cancel_steps(bigint, boolean, text)', 'usher_workflow_step_start(text)',
                             'usher_workflow_request_cancel(bigint, text)', 'usher_workflow_ended()',
                             'usher_workflow_wakes(text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_workflow_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_step text;
    c      bigint;
BEGIN
    IF NEW.parent IS NOT NULL THEN
        PERFORM 1 FROM workflows WHERE id = NEW.parent AND state = 'running' FOR UPDATE;
        IF FOUND THEN
            UPDATE workflow_steps SET state = CASE WHEN NEW.state = 'completed' THEN 'completed' ELSE 'failed' END,
                                      result = NEW.result, finished_at = now()
                WHERE job_id = 'child:' || NEW.id AND state = 'scheduled'
                RETURNING step INTO v_step;
            IF FOUND AND NEW.state = 'completed' THEN
                PERFORM usher_workflow_append(NEW.parent, 'step_completed', v_step, 'completed', NEW.result);
            ELSIF FOUND THEN
                PERFORM usher_workflow_append(NEW.parent, 'step_failed', v_step,
                    left(NEW.type || ' workflow ' || NEW.workflow_id || ' ' || NEW.state
                         || coalesce(': ' || nullif(NEW.error, ''), ''), 2048), NEW.result);
            END IF;
        END IF;
    END IF;
    FOR c IN SELECT id FROM workflows WHERE parent = NEW.id AND state = 'running' ORDER BY id FOR UPDATE LOOP
        PERFORM usher_workflow_request_cancel(c, 'its parent ' || NEW.type || ' workflow ' || NEW.workflow_id || ' ended ' || NEW.state);
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_workflow_request_cancel(p_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    c bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM workflow_events WHERE workflow = p_id AND type = 'cancel_requested') THEN
        RETURN false;
    END IF;
    PERFORM usher_workflow_append(p_id, 'cancel_requested', '', left(coalesce(p_reason, ''), 2048), NULL);
    FOR c IN SELECT id FROM workflows WHERE parent = p_id AND state = 'running' ORDER BY id FOR UPDATE LOOP
        PERFORM usher_workflow_request_cancel(c, 'its parent was asked to cancel: ' || coalesce(p_reason, ''));
    END LOOP;
    RETURN true;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_workflow_wakes(p_type text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_type IN ('started', 'step_completed', 'step_failed', 'timer_fired', 'signal_received', 'cancel_requested')
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_workflow_request_cancel(bigint, text)', 'usher_workflow_ended()',
                             'usher_workflow_wakes(text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;
-- +goose StatementEnd
DROP FUNCTION usher_workflow_step_start(text);
DROP FUNCTION usher_workflow_cancel_steps(bigint, boolean, text);
ALTER TABLE workflow_events DROP CONSTRAINT workflow_events_type_check;
DELETE FROM workflow_events WHERE type = 'step_cancelled';
ALTER TABLE workflow_events ADD CONSTRAINT workflow_events_type_check
    CHECK (type IN ('started', 'step_scheduled', 'step_completed', 'step_failed',
                    'timer_set', 'timer_fired', 'signal_received', 'cancel_requested',
                    'completed', 'failed', 'cancelled', 'migrated'));
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_state_check;
UPDATE workflow_steps SET state = 'failed' WHERE state = 'cancelled';
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_state_check
    CHECK (state IN ('scheduled', 'completed', 'failed'));
ALTER TABLE workflow_steps DROP COLUMN detached;
ALTER TABLE workflow_steps DROP COLUMN started_at;

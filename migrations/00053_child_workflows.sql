-- +goose Up
-- Child workflows (issue 27, item 6). A decision may start child
-- workflows: each is a step of its parent (workflow_steps, job_id
-- 'child:<child id>', kind usher.workflow.<child type>) that ends when the
-- child ends, with the child's result (step_completed) or why it failed or
-- was cancelled (step_failed), recorded in the transaction that ends the
-- child. A cancel asked of a workflow is asked of its running children
-- too, and a workflow that ends asks its running children to cancel.
ALTER TABLE workflows ADD COLUMN parent bigint REFERENCES workflows (id) ON DELETE SET NULL;
CREATE INDEX workflows_children ON workflows (parent) WHERE parent IS NOT NULL AND state = 'running';

-- +goose StatementBegin
-- Ask running workflow p_id to cancel, and its running children: false
-- when it was asked before. The caller holds p_id's row lock.
CREATE FUNCTION usher_workflow_request_cancel(p_id bigint, p_reason text) RETURNS boolean
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
CREATE OR REPLACE FUNCTION usher_cancel_workflow(p_type text, p_workflow_id text, p_reason text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    RETURN usher_workflow_request_cancel(usher_workflow_running(p_type, p_workflow_id, 'usher_cancel_workflow'), p_reason);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A workflow that ended (any way: its decision, a dead-lettered task, the
-- history limit): its step in its parent ends with it, and its running
-- children are asked to cancel.
CREATE FUNCTION usher_workflow_ended() RETURNS trigger
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

CREATE TRIGGER workflows_ended AFTER UPDATE OF state ON workflows
    FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION usher_workflow_ended();

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_workflow_request_cancel(bigint, text)', 'usher_cancel_workflow(text, text, text)',
                             'usher_workflow_ended()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER workflows_ended ON workflows;
DROP FUNCTION usher_workflow_ended();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_cancel_workflow(p_type text, p_workflow_id text, p_reason text DEFAULT '')
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
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_cancel_workflow(text, text, text) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd
DROP FUNCTION usher_workflow_request_cancel(bigint, text);
DROP INDEX workflows_children;
ALTER TABLE workflows DROP COLUMN parent;

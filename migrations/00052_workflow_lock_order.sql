-- +goose Up
-- Deadlocks between workflow steps ending in batches (issue 27): a batch's
-- marks lock each workflow whose step they end, in the batch's order, and
-- two batches (or a batch and the timer scan) holding steps of the same
-- workflows in other orders deadlocked (the server's log, under 1,000
-- workflows at once: usher_applied_batch against usher_applied_batch and
-- against usher_workflow_fire_timers). Postgres broke each by aborting one
-- transaction, which ran again, so nothing was lost, but every abort cost a
-- batch. Every transaction that locks several workflows now locks them in
-- id order first.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_applied_batch(p_outbox_ids bigint[], p_kinds text[], p_job_ids text[], p_attempts integer[],
    p_deliveries integer[], p_request_ids text[], p_stream_ids text[], p_consumer text, p_plugin text,
    p_version text, p_guard text, p_started timestamptz[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer := coalesce(cardinality(p_outbox_ids), 0);
    marked integer;
    bad record;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_kinds) <> n OR cardinality(p_job_ids) <> n OR cardinality(p_attempts) <> n
       OR cardinality(p_deliveries) <> n OR cardinality(p_request_ids) <> n OR cardinality(p_stream_ids) <> n
       OR cardinality(p_started) <> n THEN
        RAISE EXCEPTION 'usher_applied_batch: the arrays differ in length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The workflows whose steps the batch ends, locked in id order before
    -- the marks' trigger (usher_workflow_job_done) locks each in the
    -- batch's order: two batches, or a batch and the timer scan, ending
    -- steps of the same workflows in another order would deadlock.
    PERFORM 1 FROM workflows w
        WHERE w.id IN (SELECT s.workflow FROM workflow_steps s WHERE s.job_id = ANY(p_job_ids))
        ORDER BY w.id FOR UPDATE OF w;
    -- Each element marks its row when the row is of its kind and job and
    -- the kind is one the caller serves; a row already done keeps its
    -- outcome. Fewer rows marked than elements refuses the batch (the
    -- exception undoes the marks), and only then is the reason looked for.
    UPDATE outbox x SET done_at = coalesce(x.done_at, clock_timestamp()),
                        outcome = CASE WHEN x.done_at IS NULL THEN 'applied' ELSE x.outcome END
        FROM unnest(p_outbox_ids, p_kinds, p_job_ids) AS u(o, k, j), plugin_kinds pk
        WHERE x.id = u.o AND x.kind = u.k AND coalesce(x.job_id, x.id::text) = u.j
          AND pk.kind = u.k AND pk.db_role = session_user;
    GET DIAGNOSTICS marked = ROW_COUNT;
    IF marked <> n THEN
        PERFORM usher_check_serves_all(p_kinds);
        SELECT u.o, u.k, u.j INTO bad
            FROM unnest(p_outbox_ids, p_kinds, p_job_ids) AS u(o, k, j)
            WHERE NOT EXISTS (SELECT 1 FROM outbox x
                              WHERE x.id = u.o AND x.kind = u.k AND coalesce(x.job_id, x.id::text) = u.j)
            LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'outbox row % is not a % row of job %', bad.o, bad.k, bad.j
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RAISE EXCEPTION 'usher_applied_batch: an outbox row twice in one batch'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO job_history (job_id, kind, outbox_id, request_id, attempt, deliveries, stream_id, consumer,
                             plugin, plugin_version, guard, verdict, started_at)
        SELECT u.j, u.k, u.o, left(coalesce(u.r, ''), 2048), u.a, u.d, left(coalesce(u.s, ''), 64),
               left(coalesce(p_consumer, ''), 256), left(coalesce(p_plugin, ''), 64),
               left(coalesce(p_version, ''), 128), left(coalesce(p_guard, ''), 32), 'applied',
               least(coalesce(u.t, clock_timestamp()), clock_timestamp())
        FROM unnest(p_outbox_ids, p_kinds, p_job_ids, p_attempts, p_deliveries, p_request_ids, p_stream_ids, p_started)
             AS u(o, k, j, a, d, r, s, t);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- CREATE OR REPLACE keeps the owner and the grants, not the settings.
DO $$
DECLARE
    f text := 'usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])';
BEGIN
    EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off', f);
    EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
END
$$;
-- +goose StatementEnd


-- +goose StatementBegin
-- The due timers' workflows are locked in id order, as a batch's are.
CREATE OR REPLACE FUNCTION usher_workflow_fire_timers(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    FOR t IN SELECT d.workflow, d.name FROM (SELECT workflow, name FROM workflow_timers
                                             WHERE fired_at IS NULL AND fire_at <= now()
                                             ORDER BY fire_at LIMIT p_limit FOR UPDATE SKIP LOCKED) d
             ORDER BY d.workflow, d.name LOOP
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
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_workflow_fire_timers(integer) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_applied_batch(p_outbox_ids bigint[], p_kinds text[], p_job_ids text[], p_attempts integer[],
    p_deliveries integer[], p_request_ids text[], p_stream_ids text[], p_consumer text, p_plugin text,
    p_version text, p_guard text, p_started timestamptz[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer := coalesce(cardinality(p_outbox_ids), 0);
    marked integer;
    bad record;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_kinds) <> n OR cardinality(p_job_ids) <> n OR cardinality(p_attempts) <> n
       OR cardinality(p_deliveries) <> n OR cardinality(p_request_ids) <> n OR cardinality(p_stream_ids) <> n
       OR cardinality(p_started) <> n THEN
        RAISE EXCEPTION 'usher_applied_batch: the arrays differ in length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each element marks its row when the row is of its kind and job and
    -- the kind is one the caller serves; a row already done keeps its
    -- outcome. Fewer rows marked than elements refuses the batch (the
    -- exception undoes the marks), and only then is the reason looked for.
    UPDATE outbox x SET done_at = coalesce(x.done_at, clock_timestamp()),
                        outcome = CASE WHEN x.done_at IS NULL THEN 'applied' ELSE x.outcome END
        FROM unnest(p_outbox_ids, p_kinds, p_job_ids) AS u(o, k, j), plugin_kinds pk
        WHERE x.id = u.o AND x.kind = u.k AND coalesce(x.job_id, x.id::text) = u.j
          AND pk.kind = u.k AND pk.db_role = session_user;
    GET DIAGNOSTICS marked = ROW_COUNT;
    IF marked <> n THEN
        PERFORM usher_check_serves_all(p_kinds);
        SELECT u.o, u.k, u.j INTO bad
            FROM unnest(p_outbox_ids, p_kinds, p_job_ids) AS u(o, k, j)
            WHERE NOT EXISTS (SELECT 1 FROM outbox x
                              WHERE x.id = u.o AND x.kind = u.k AND coalesce(x.job_id, x.id::text) = u.j)
            LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'outbox row % is not a % row of job %', bad.o, bad.k, bad.j
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RAISE EXCEPTION 'usher_applied_batch: an outbox row twice in one batch'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO job_history (job_id, kind, outbox_id, request_id, attempt, deliveries, stream_id, consumer,
                             plugin, plugin_version, guard, verdict, started_at)
        SELECT u.j, u.k, u.o, left(coalesce(u.r, ''), 2048), u.a, u.d, left(coalesce(u.s, ''), 64),
               left(coalesce(p_consumer, ''), 256), left(coalesce(p_plugin, ''), 64),
               left(coalesce(p_version, ''), 128), left(coalesce(p_guard, ''), 32), 'applied',
               least(coalesce(u.t, clock_timestamp()), clock_timestamp())
        FROM unnest(p_outbox_ids, p_kinds, p_job_ids, p_attempts, p_deliveries, p_request_ids, p_stream_ids, p_started)
             AS u(o, k, j, a, d, r, s, t);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- CREATE OR REPLACE keeps the owner and the grants, not the settings.
DO $$
DECLARE
    f text := 'usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])';
BEGIN
    EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off', f);
    EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
END
$$;
-- +goose StatementEnd


-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_workflow_fire_timers(p_limit integer) RETURNS integer
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
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_workflow_fire_timers(integer) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd

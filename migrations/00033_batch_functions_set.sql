-- +goose Up
-- The batch functions of 00032 in a fixed number of statements whatever the
-- batch's size, planned once per session (cmd/bench with
-- pg_stat_statements at 16 and 64 in flight showed where the time went):
--
-- usher_applied_batch: four statements instead of two per job (one that
-- reads the batch's outbox rows by primary key, one that finds an element
-- naming no outbox row of its kind and job and refuses the batch as
-- before, one update of the open rows, one insert into job_history). The
-- loop cost about 70 us of server time per job, more than the job's own
-- effect.
--
-- usher_check_serves_all: one statement instead of a call of
-- usher_check_serves per kind; it runs twice per batch.
--
-- A plan cached in a session must stay right when the outbox grows from
-- empty to millions of rows (00032's join over unnest() was once cached as
-- a scan of the whole table). So no statement here joins the outbox: the
-- rows are read and updated by id = ANY, which with seq scans off for the
-- function is an index scan of the primary key in any plan; the check then
-- compares arrays in memory. With that, the functions use generic plans
-- from their first call instead of planning every statement per call.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_applied_batch(p_outbox_ids bigint[], p_kinds text[], p_job_ids text[], p_attempts integer[],
    p_deliveries integer[], p_request_ids text[], p_stream_ids text[], p_consumer text, p_plugin text,
    p_version text, p_guard text, p_started timestamptz[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer := coalesce(cardinality(p_outbox_ids), 0);
    f_ids bigint[];
    f_kinds text[];
    f_jobs text[];
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
    PERFORM usher_check_serves_all(p_kinds);
    SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.kind), '{}'),
           coalesce(array_agg(coalesce(x.job_id, x.id::text)), '{}')
        INTO f_ids, f_kinds, f_jobs
        FROM outbox x WHERE x.id = ANY (p_outbox_ids);
    SELECT u.o, u.k, u.j INTO bad
        FROM unnest(p_outbox_ids, p_kinds, p_job_ids) AS u(o, k, j)
        WHERE NOT EXISTS (SELECT 1 FROM unnest(f_ids, f_kinds, f_jobs) AS f(o, k, j)
                          WHERE f.o = u.o AND f.k = u.k AND f.j = u.j)
        LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox row % is not a % row of job %', bad.o, bad.k, bad.j
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    UPDATE outbox SET done_at = clock_timestamp(), outcome = 'applied'
        WHERE id = ANY (p_outbox_ids) AND done_at IS NULL;
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
-- Every kind of p_kinds is one the caller serves, or none is recorded.
CREATE OR REPLACE FUNCTION usher_check_serves_all(p_kinds text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    k text;
BEGIN
    SELECT u INTO k FROM unnest(p_kinds) u
        WHERE NOT EXISTS (SELECT 1 FROM plugin_kinds WHERE kind = u AND db_role = session_user)
        LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'role % does not serve kind %', session_user, k
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- CREATE OR REPLACE keeps the owner and the grants, not the settings.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_check_serves_all(text[])',
                             'usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOREACH f IN ARRAY ARRAY['usher_record_jobs(text[], text[])',
                             'usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off', f);
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_check_serves_all(p_kinds text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT DISTINCT u FROM unnest(p_kinds) u LOOP
        PERFORM usher_check_serves(k);
    END LOOP;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_applied_batch(p_outbox_ids bigint[], p_kinds text[], p_job_ids text[], p_attempts integer[],
    p_deliveries integer[], p_request_ids text[], p_stream_ids text[], p_consumer text, p_plugin text,
    p_version text, p_guard text, p_started timestamptz[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer := coalesce(cardinality(p_outbox_ids), 0);
    open_row boolean;
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
    PERFORM usher_check_serves_all(p_kinds);
    FOR i IN 1..n LOOP
        SELECT done_at IS NULL INTO open_row FROM outbox
            WHERE id = p_outbox_ids[i] AND kind = p_kinds[i] AND coalesce(job_id, id::text) = p_job_ids[i];
        IF NOT FOUND THEN
            RAISE EXCEPTION 'outbox row % is not a % row of job %', p_outbox_ids[i], p_kinds[i], p_job_ids[i]
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF open_row THEN
            UPDATE outbox SET done_at = clock_timestamp(), outcome = 'applied'
                WHERE id = p_outbox_ids[i] AND done_at IS NULL;
        END IF;
    END LOOP;
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
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_check_serves_all(text[])',
                             'usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    ALTER FUNCTION usher_record_jobs(text[], text[]) RESET enable_seqscan;
    ALTER FUNCTION usher_record_jobs(text[], text[]) RESET plan_cache_mode;
END
$$;
-- +goose StatementEnd

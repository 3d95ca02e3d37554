-- +goose Up
-- Server time a batch spends on bookkeeping, cut where pg_stat_statements
-- (cmd/bench, 64 in flight) showed it:
--
-- usher_statements_check: the check of a reset session's prepared
-- statements (host/sandbox/statements.go), which ran as a statement of its
-- own and was planned at every reset, about 0.1 ms of planning per
-- transaction against 0.01 ms of execution. In a function its plan is
-- cached for the session. It reads only the caller's own session, so it
-- is no SECURITY DEFINER: the plugin's role runs it after the reset, as
-- the host grants it (sandbox.Prepare).
--
-- usher_applied_batch: the batch's outbox rows are read by the UPDATE that
-- marks them (RETURNING), not by a SELECT before it; a row already done
-- keeps its outcome as before. One index scan of the batch's rows instead
-- of two.
--
-- usher_record_jobs: which jobs the insert recorded is found with one
-- join, not with a scan of the inserted rows per job.
--
-- usher_check_serves_all: each kind once, not once per job.

-- +goose StatementBegin
CREATE FUNCTION usher_statements_check(p_count integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    from_sql bigint;
BEGIN
    SELECT count(*), count(*) FILTER (WHERE s.from_sql) INTO n, from_sql FROM pg_catalog.pg_prepared_statements s;
    IF from_sql <> 0 OR n <> p_count THEN
        RAISE EXCEPTION 'usher: the session''s prepared statements are not the host''s: % held, % from SQL PREPARE, % expected',
            n, from_sql, p_count
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
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
    -- Mark the rows and read them back in one scan; an element that names
    -- no row of its kind and job refuses the batch, and the exception
    -- undoes the marks.
    WITH marked AS (
        UPDATE outbox x SET done_at = coalesce(x.done_at, clock_timestamp()),
                            outcome = CASE WHEN x.done_at IS NULL THEN 'applied' ELSE x.outcome END
            WHERE x.id = ANY (p_outbox_ids)
            RETURNING x.id, x.kind, coalesce(x.job_id, x.id::text) AS job
    )
    SELECT coalesce(array_agg(m.id), '{}'), coalesce(array_agg(m.kind), '{}'), coalesce(array_agg(m.job), '{}')
        INTO f_ids, f_kinds, f_jobs FROM marked m;
    SELECT u.o, u.k, u.j INTO bad
        FROM unnest(p_outbox_ids, p_kinds, p_job_ids) AS u(o, k, j)
        WHERE NOT EXISTS (SELECT 1 FROM unnest(f_ids, f_kinds, f_jobs) AS f(o, k, j)
                          WHERE f.o = u.o AND f.k = u.k AND f.j = u.j)
        LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox row % is not a % row of job %', bad.o, bad.k, bad.j
            USING ERRCODE = 'insufficient_privilege';
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
CREATE OR REPLACE FUNCTION usher_record_jobs(p_job_ids text[], p_kinds text[]) RETURNS boolean[]
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v boolean[];
BEGIN
    IF cardinality(p_job_ids) IS DISTINCT FROM cardinality(p_kinds) THEN
        RAISE EXCEPTION 'usher_record_jobs: % job ids and % kinds', cardinality(p_job_ids), cardinality(p_kinds)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM usher_check_serves_all(p_kinds);
    IF (SELECT count(DISTINCT (j, k)) FROM unnest(p_job_ids, p_kinds) AS u(j, k)) <> cardinality(p_job_ids) THEN
        RAISE EXCEPTION 'usher_record_jobs: a job id twice in one batch'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- No job twice (above), so the join gives each job one row.
    WITH wanted AS (
        SELECT j, k, n FROM unnest(p_job_ids, p_kinds) WITH ORDINALITY AS u(j, k, n)
    ), ins AS (
        INSERT INTO processed_jobs (job_id, kind) SELECT j, k FROM wanted
            ON CONFLICT (kind, job_id) DO NOTHING
            RETURNING job_id, kind
    )
    SELECT array_agg(i.job_id IS NOT NULL ORDER BY w.n)
        INTO v FROM wanted w LEFT JOIN ins i ON i.job_id = w.j AND i.kind = w.k;
    RETURN coalesce(v, '{}');
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
    SELECT d.u INTO k FROM (SELECT DISTINCT u FROM unnest(p_kinds) u) d
        WHERE NOT EXISTS (SELECT 1 FROM plugin_kinds WHERE kind = d.u AND db_role = session_user)
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
    FOREACH f IN ARRAY ARRAY['usher_check_serves_all(text[])', 'usher_record_jobs(text[], text[])',
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

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_statements_check(integer) SET search_path = %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION usher_statements_check(integer) FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION usher_statements_check(integer);

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
-- Guard 4 for a batch: element i is true when this run recorded job i (it
-- applies), false when it was recorded before (a duplicate). One job id
-- twice in a batch is refused: both would read as recorded now.
CREATE OR REPLACE FUNCTION usher_record_jobs(p_job_ids text[], p_kinds text[]) RETURNS boolean[]
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v boolean[];
BEGIN
    IF cardinality(p_job_ids) IS DISTINCT FROM cardinality(p_kinds) THEN
        RAISE EXCEPTION 'usher_record_jobs: % job ids and % kinds', cardinality(p_job_ids), cardinality(p_kinds)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM usher_check_serves_all(p_kinds);
    IF (SELECT count(DISTINCT (j, k)) FROM unnest(p_job_ids, p_kinds) AS u(j, k)) <> cardinality(p_job_ids) THEN
        RAISE EXCEPTION 'usher_record_jobs: a job id twice in one batch'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH wanted AS (
        SELECT j, k, n FROM unnest(p_job_ids, p_kinds) WITH ORDINALITY AS u(j, k, n)
    ), ins AS (
        INSERT INTO processed_jobs (job_id, kind) SELECT j, k FROM wanted
            ON CONFLICT (kind, job_id) DO NOTHING
            RETURNING job_id, kind
    )
    SELECT array_agg(EXISTS (SELECT 1 FROM ins WHERE ins.job_id = w.j AND ins.kind = w.k) ORDER BY w.n)
        INTO v FROM wanted w;
    RETURN coalesce(v, '{}');
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
    FOREACH f IN ARRAY ARRAY['usher_check_serves_all(text[])', 'usher_record_jobs(text[], text[])',
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

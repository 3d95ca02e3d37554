-- +goose Up
-- A batch of guard-4 jobs (host/guard/batch.go) in one statement each for
-- its records and its outcomes, instead of one per job: the same checks as
-- usher_record_job and usher_applied_logged, row for row, so a plugin role
-- that calls them itself can do nothing the single forms do not let it.

-- 00020 made a second index identical to 00016's outbox_job; every outbox
-- insert paid for both.
DROP INDEX IF EXISTS outbox_job_id;

-- +goose StatementBegin
-- Every kind of p_kinds is one the caller serves, or none is recorded.
CREATE FUNCTION usher_check_serves_all(p_kinds text[]) RETURNS void
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
-- Guard 4 for a batch: element i is true when this run recorded job i (it
-- applies), false when it was recorded before (a duplicate). One job id
-- twice in a batch is refused: both would read as recorded now.
CREATE FUNCTION usher_record_jobs(p_job_ids text[], p_kinds text[]) RETURNS boolean[]
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
-- usher_applied_logged for a batch: element i of each array is job i's
-- argument. Every row must name an outbox row of its kind, whose job it is,
-- or nothing is recorded. Row by row, by primary key: a plan the function
-- caches while the outbox is small must stay right when it is large (a
-- join over unnest() was planned once as a scan of the whole table).
CREATE FUNCTION usher_applied_batch(p_outbox_ids bigint[], p_kinds text[], p_job_ids text[], p_attempts integer[],
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
    FOREACH f IN ARRAY ARRAY['usher_check_serves_all(text[])', 'usher_record_jobs(text[], text[])',
                             'usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[]);
DROP FUNCTION usher_record_jobs(text[], text[]);
DROP FUNCTION usher_check_serves_all(text[]);
CREATE INDEX outbox_job_id ON outbox (job_id) WHERE job_id IS NOT NULL;

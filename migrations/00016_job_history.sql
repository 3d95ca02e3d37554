-- +goose Up
-- Job history: one row per delivery of a job that ran to a verdict
-- (applied, absorbed, retry, dead-lettered, abandoned). An applied run of
-- a job with an outbox row writes its row in the job's own transaction,
-- through usher_applied_logged below, so a rolled-back run leaves none;
-- every other row is the host's, written with the delivery's outcome.
-- Plugin roles hold no privilege on the table. Kept for the host's
-- HistoryRetention (host/history.Trimmer).
CREATE TABLE job_history (
    id             bigserial   PRIMARY KEY,
    job_id         text        NOT NULL,
    kind           text        NOT NULL,
    outbox_id      bigint,
    request_id     text        NOT NULL DEFAULT '',
    attempt        integer     NOT NULL DEFAULT 0,
    deliveries     integer     NOT NULL DEFAULT 0,
    stream_id      text        NOT NULL DEFAULT '',
    consumer       text        NOT NULL DEFAULT '',
    plugin         text        NOT NULL DEFAULT '',
    plugin_version text        NOT NULL DEFAULT '',
    guard          text        NOT NULL DEFAULT '',
    verdict        text        NOT NULL,
    reason         text        NOT NULL DEFAULT '',
    error          text        NOT NULL DEFAULT '',
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX job_history_job ON job_history (job_id, id);
CREATE INDEX job_history_finished ON job_history (finished_at);

-- The job whose handler enqueued the row (usher_enqueue), NULL for the
-- application's rows: with request_id it links a workflow's jobs into a
-- tree.
ALTER TABLE outbox ADD COLUMN parent_job_id text;
CREATE INDEX outbox_request ON outbox (request_id) WHERE request_id <> '';
CREATE INDEX outbox_job ON outbox (job_id) WHERE job_id IS NOT NULL;

-- +goose StatementBegin
-- usher_applied, and the delivery's history row, in the job's own
-- transaction: the effects, the outcome and the history commit together.
-- The verdict is always 'applied' and the clock the database's; the row
-- must name an outbox row of the kind, whose job it is.
CREATE FUNCTION usher_applied_logged(p_outbox_id bigint, p_kind text, p_job_id text, p_attempt integer,
    p_deliveries integer, p_request_id text, p_stream_id text, p_consumer text, p_plugin text,
    p_version text, p_guard text, p_started timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM usher_applied(p_outbox_id, p_kind);
    IF NOT EXISTS (SELECT 1 FROM outbox WHERE id = p_outbox_id AND kind = p_kind
                   AND coalesce(job_id, id::text) = p_job_id) THEN
        RAISE EXCEPTION 'outbox row % is not a % row of job %', p_outbox_id, p_kind, p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO job_history (job_id, kind, outbox_id, request_id, attempt, deliveries, stream_id, consumer,
                             plugin, plugin_version, guard, verdict, started_at)
        VALUES (p_job_id, p_kind, p_outbox_id, left(coalesce(p_request_id, ''), 2048), p_attempt, p_deliveries,
                left(coalesce(p_stream_id, ''), 64), left(coalesce(p_consumer, ''), 256), left(coalesce(p_plugin, ''), 64),
                left(coalesce(p_version, ''), 128), left(coalesce(p_guard, ''), 32), 'applied',
                least(coalesce(p_started, clock_timestamp()), clock_timestamp()));
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- usher_enqueue (00012), recording the enqueuing job. Only the host's
-- call names the parent; a plugin calling the function itself could name
-- another of its jobs, which only mislinks its own workflow view.
CREATE FUNCTION usher_enqueue(p_from_kind text, p_kind text, p_payload jsonb, p_request_id text, p_trace text, p_parent_job text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM usher_check_serves(p_from_kind);
    -- outbox.Add's limits: an entry over the host's entry limit could
    -- not be verified and would be dead-lettered as a forgery.
    IF octet_length(p_payload::text) > 1032192 OR octet_length(p_kind) > 200
       OR octet_length(p_request_id) > 2048 OR octet_length(p_trace) > 2048 THEN
        RAISE EXCEPTION 'enqueue: a message over the outbox''s limits (payload 1032192 bytes, kind 200, request_id and trace 2048)'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM plugin_kinds WHERE kind = p_kind AND db_role = session_user)
       AND NOT EXISTS (SELECT 1 FROM plugin_enqueues WHERE kind = p_kind AND db_role = session_user) THEN
        RAISE EXCEPTION 'role % may not enqueue kind % (not its own, and not in its manifest''s enqueues)', session_user, p_kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO outbox (kind, payload, request_id, trace, enqueued_by, parent_job_id)
        VALUES (p_kind, p_payload, coalesce(p_request_id, ''), coalesce(p_trace, ''), session_user, left(p_parent_job, 256))
        RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The five-argument form stays for callers that name no parent.
CREATE OR REPLACE FUNCTION usher_enqueue(p_from_kind text, p_kind text, p_payload jsonb, p_request_id text, p_trace text)
RETURNS bigint LANGUAGE sql SECURITY DEFINER AS $$
    SELECT usher_enqueue(p_from_kind, p_kind, p_payload, p_request_id, p_trace, NULL::text)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_applied_logged(bigint, text, text, integer, integer, text, text, text, text, text, text, timestamptz)',
                             'usher_enqueue(text, text, jsonb, text, text, text)', 'usher_enqueue(text, text, jsonb, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_enqueue(p_from_kind text, p_kind text, p_payload jsonb, p_request_id text, p_trace text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM usher_check_serves(p_from_kind);
    -- outbox.Add's limits: an entry over the host's entry limit could
    -- not be verified and would be dead-lettered as a forgery.
    IF octet_length(p_payload::text) > 1032192 OR octet_length(p_kind) > 200
       OR octet_length(p_request_id) > 2048 OR octet_length(p_trace) > 2048 THEN
        RAISE EXCEPTION 'enqueue: a message over the outbox''s limits (payload 1032192 bytes, kind 200, request_id and trace 2048)'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM plugin_kinds WHERE kind = p_kind AND db_role = session_user)
       AND NOT EXISTS (SELECT 1 FROM plugin_enqueues WHERE kind = p_kind AND db_role = session_user) THEN
        RAISE EXCEPTION 'role % may not enqueue kind % (not its own, and not in its manifest''s enqueues)', session_user, p_kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO outbox (kind, payload, request_id, trace, enqueued_by)
        VALUES (p_kind, p_payload, coalesce(p_request_id, ''), coalesce(p_trace, ''), session_user)
        RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_enqueue(text, text, jsonb, text, text) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd
DROP FUNCTION usher_enqueue(text, text, jsonb, text, text, text);
DROP FUNCTION usher_applied_logged(bigint, text, text, integer, integer, text, text, text, text, text, text, timestamptz);
DROP INDEX outbox_job;
DROP INDEX outbox_request;
ALTER TABLE outbox DROP COLUMN parent_job_id;
DROP TABLE job_history;

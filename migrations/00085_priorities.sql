-- +goose Up
-- A job's priority (issue 28): 1, the highest, to 5, the lowest; 3 for a
-- job that names none (the scale and default of Temporal's priority
-- keys). The relay adds an entry to its shard's band for its priority
-- (stream.BandKey) and every host reads a shard's bands highest first,
-- so a job of a higher priority starts before any of a lower one that
-- waits. A job keeps its priority through its retries (scheduled_jobs),
-- its dead letter and its requeue, and a job a handler enqueues takes
-- its parent's.
ALTER TABLE outbox ADD COLUMN priority smallint NOT NULL DEFAULT 3
    CONSTRAINT outbox_priority CHECK (priority BETWEEN 1 AND 5);
ALTER TABLE scheduled_jobs ADD COLUMN priority smallint NOT NULL DEFAULT 3
    CONSTRAINT scheduled_jobs_priority CHECK (priority BETWEEN 1 AND 5);
ALTER TABLE dead_letters ADD COLUMN priority smallint NOT NULL DEFAULT 3
    CONSTRAINT dead_letters_priority CHECK (priority BETWEEN 1 AND 5);

-- +goose StatementBegin
-- usher_enqueue_job with a priority (NULL: 3). Every argument is named
-- (no defaults), so a call with six or fewer is the six-argument form's,
-- never ambiguous:
--   SELECT usher_enqueue_job('send_tickets', '{"order_id": 7}', NULL, NULL, NULL, NULL, 1);
-- Its own grant, as the deduplicating form has.
CREATE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text, trace text, dedup_key text, dedup_window interval, priority integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
    v_won boolean := true;
    v_trace text := coalesce(trace, '');
    v_priority integer := coalesce(priority, 3);
BEGIN
    IF kind IS NULL OR kind = '' THEN
        RAISE EXCEPTION 'usher_enqueue_job: the job has no kind'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'usher_enqueue_job: % job has no payload (pass ''{}'' or ''null''::jsonb for none)', kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_priority NOT BETWEEN 1 AND 5 THEN
        RAISE EXCEPTION 'usher_enqueue_job: % job has priority %: a priority is 1 (the highest) to 5 (the lowest), 3 by default', kind, v_priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(kind) > 200 THEN
        RAISE EXCEPTION 'usher_enqueue_job: kind of % bytes is over the 200-byte limit', octet_length(kind)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF octet_length(payload::text) > 1032192 THEN
        RAISE EXCEPTION 'usher_enqueue_job: % payload of % bytes is over the 1032192-byte limit', kind, octet_length(payload::text)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF octet_length(request_id) > 2048 OR octet_length(v_trace) > 2048 THEN
        RAISE EXCEPTION 'usher_enqueue_job: % request_id or trace is over the 2048-byte limit', kind
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF v_trace = '' THEN
        -- A new W3C traceparent, as client.Enqueue and outbox.Add make.
        v_trace := '00-' || replace(gen_random_uuid()::text, '-', '') || '-'
                   || left(replace(gen_random_uuid()::text, '-', ''), 16) || '-01';
    END IF;
    IF coalesce(dedup_key, '') = '' THEN
        v_id := nextval(pg_get_serial_sequence('outbox', 'id'));
    ELSE
        SELECT c.id, c.won INTO v_id, v_won FROM usher_dedup_claim(kind, dedup_key, dedup_window) c;
    END IF;
    IF v_won THEN
        INSERT INTO outbox (id, kind, payload, request_id, trace, priority)
            VALUES (v_id, kind, payload, coalesce(request_id, ''), v_trace, v_priority);
    END IF;
    RETURN v_id;
END
$$;
-- +goose StatementEnd

-- The six-argument form keeps its signature, its default and its grants
-- (CREATE OR REPLACE keeps the ACL) and enqueues at the default priority.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text, trace text, dedup_key text, dedup_window interval DEFAULT NULL)
RETURNS bigint LANGUAGE sql SECURITY DEFINER AS $$
    SELECT usher_enqueue_job(kind, payload, request_id, trace, dedup_key, dedup_window, NULL::integer)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- usher_enqueue (00016) as the host calls it for a handler, naming the
-- parent: the job takes its parent's priority (the parent's latest row;
-- the default when retention has removed it), so the work a
-- high-priority job starts is not queued behind the low.
CREATE OR REPLACE FUNCTION usher_enqueue(p_from_kind text, p_kind text, p_payload jsonb, p_request_id text, p_trace text, p_parent_job text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
    v_priority smallint;
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
    IF p_parent_job IS NOT NULL THEN
        SELECT o.priority INTO v_priority FROM outbox o
            WHERE o.job_id = p_parent_job
               OR (o.job_id IS NULL AND p_parent_job ~ '^[0-9]{1,18}$' AND o.id = p_parent_job::bigint)
            ORDER BY o.id DESC LIMIT 1;
    END IF;
    INSERT INTO outbox (kind, payload, request_id, trace, enqueued_by, parent_job_id, priority)
        VALUES (p_kind, p_payload, coalesce(p_request_id, ''), coalesce(p_trace, ''), session_user, left(p_parent_job, 256),
                coalesce(v_priority, 3))
        RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval, integer) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION usher_enqueue(text, text, jsonb, text, text, text) SET search_path = %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval, integer) FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_enqueue(p_from_kind text, p_kind text, p_payload jsonb, p_request_id text, p_trace text, p_parent_job text)
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
DROP FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval, integer);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text, trace text, dedup_key text, dedup_window interval DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
    v_won boolean := true;
    v_trace text := coalesce(trace, '');
BEGIN
    IF kind IS NULL OR kind = '' THEN
        RAISE EXCEPTION 'usher_enqueue_job: the job has no kind'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'usher_enqueue_job: % job has no payload (pass ''{}'' or ''null''::jsonb for none)', kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(kind) > 200 THEN
        RAISE EXCEPTION 'usher_enqueue_job: kind of % bytes is over the 200-byte limit', octet_length(kind)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF octet_length(payload::text) > 1032192 THEN
        RAISE EXCEPTION 'usher_enqueue_job: % payload of % bytes is over the 1032192-byte limit', kind, octet_length(payload::text)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF octet_length(request_id) > 2048 OR octet_length(v_trace) > 2048 THEN
        RAISE EXCEPTION 'usher_enqueue_job: % request_id or trace is over the 2048-byte limit', kind
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF v_trace = '' THEN
        -- A new W3C traceparent, as client.Enqueue and outbox.Add make.
        v_trace := '00-' || replace(gen_random_uuid()::text, '-', '') || '-'
                   || left(replace(gen_random_uuid()::text, '-', ''), 16) || '-01';
    END IF;
    IF coalesce(dedup_key, '') = '' THEN
        v_id := nextval(pg_get_serial_sequence('outbox', 'id'));
    ELSE
        SELECT c.id, c.won INTO v_id, v_won FROM usher_dedup_claim(kind, dedup_key, dedup_window) c;
    END IF;
    IF v_won THEN
        INSERT INTO outbox (id, kind, payload, request_id, trace)
            VALUES (v_id, kind, payload, coalesce(request_id, ''), v_trace);
    END IF;
    RETURN v_id;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION usher_enqueue(text, text, jsonb, text, text, text) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd
ALTER TABLE dead_letters DROP COLUMN priority;
ALTER TABLE scheduled_jobs DROP COLUMN priority;
ALTER TABLE outbox DROP COLUMN priority;

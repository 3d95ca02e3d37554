-- +goose Up
-- Job controls an operator or an application expects of a queue:
-- deduplication by a business key at enqueue, and pausing a kind.

-- A deduplication key claimed by the first job enqueued with it, per kind:
-- another enqueue of the same kind and key before expires_at returns
-- outbox_id and enqueues nothing. The row is written in the enqueuing
-- transaction, so a rollback frees the key, and the primary key makes
-- concurrent enqueues (any process, any host) take turns on it.
CREATE TABLE job_dedup_keys (
    kind       text        NOT NULL,
    dedup_key  text        NOT NULL,
    outbox_id  bigint      NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, dedup_key)
);
CREATE INDEX job_dedup_keys_expires ON job_dedup_keys (expires_at);

-- usher_dedup_claim claims (kind, key) for a new outbox id for p_window
-- (default 24 hours): won is true and id the new job's outbox id (from the
-- outbox's sequence, for the caller to insert), or won is false and id is
-- the job that holds the key. An expired key is taken over. The window is
-- measured on the clock when the claim runs, not the transaction's start.
-- Every claim deletes up to two expired keys, so the table holds the keys
-- still in their window and at most as many expired ones as were claimed
-- since the last keyed enqueue.
-- +goose StatementBegin
CREATE FUNCTION usher_dedup_claim(p_kind text, p_key text, p_window interval, OUT id bigint, OUT won boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_new bigint;
    v_now timestamptz := clock_timestamp();
    v_window interval := coalesce(p_window, interval '24 hours');
BEGIN
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'usher_dedup_claim: % job has an empty deduplication key', p_kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(p_key) > 2048 THEN
        RAISE EXCEPTION 'usher_enqueue_job: % deduplication key of % bytes is over the 2048-byte limit', p_kind, octet_length(p_key)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF v_window <= interval '0' THEN
        RAISE EXCEPTION 'usher_enqueue_job: % deduplication window % is not positive', p_kind, v_window
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_new := nextval(pg_get_serial_sequence('outbox', 'id'));
    -- One statement: it inserts, takes over an expired key, or (waiting
    -- for a concurrent claim's transaction to end) returns the holder.
    INSERT INTO job_dedup_keys AS d (kind, dedup_key, outbox_id, created_at, expires_at)
        VALUES (p_kind, p_key, v_new, v_now, v_now + v_window)
    ON CONFLICT (kind, dedup_key) DO UPDATE SET
        outbox_id  = CASE WHEN d.expires_at <= v_now THEN EXCLUDED.outbox_id ELSE d.outbox_id END,
        created_at = CASE WHEN d.expires_at <= v_now THEN EXCLUDED.created_at ELSE d.created_at END,
        expires_at = CASE WHEN d.expires_at <= v_now THEN EXCLUDED.expires_at ELSE d.expires_at END
    RETURNING d.outbox_id INTO id;
    won := id = v_new;
    DELETE FROM job_dedup_keys WHERE ctid IN (
        SELECT ctid FROM job_dedup_keys WHERE expires_at < v_now ORDER BY expires_at LIMIT 2 FOR UPDATE SKIP LOCKED);
END
$$;
-- +goose StatementEnd

-- usher_enqueue_job with a deduplication key: usher_enqueue_job's checks
-- and insert, unless (kind, dedup_key) is held by a job enqueued less than
-- dedup_window ago (default 24 hours): then it returns that job's outbox
-- id and enqueues nothing. A NULL or empty dedup_key enqueues as the
-- four-argument function does, which now calls this one. Its own grant
-- (an application granted only the four-argument form cannot deduplicate).
-- +goose StatementBegin
CREATE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text, trace text, dedup_key text, dedup_window interval DEFAULT NULL)
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

-- The four-argument form keeps its signature and its grants (CREATE OR
-- REPLACE keeps the ACL) and enqueues with no key.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text DEFAULT NULL, trace text DEFAULT NULL)
RETURNS bigint LANGUAGE sql SECURITY DEFINER AS $$
    SELECT usher_enqueue_job(kind, payload, request_id, trace, NULL::text, NULL::interval)
$$;
-- +goose StatementEnd

-- Kinds an operator paused (host kinds pause, the admin API): while a
-- kind's row has no resumed_at, every host leaves its deliveries waiting
-- in the stream (host/pause). One row per kind: its last pause.
CREATE TABLE kind_pauses (
    kind       text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL,
    paused_by  text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    resumed_at timestamptz,
    resumed_by text
);

-- What operators did, who and when (host/actions): pauses and resumes so
-- far. actor is who the tool says acted; db_user the database login that
-- wrote it.
CREATE TABLE operator_actions (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    db_user name        NOT NULL DEFAULT session_user,
    action  text        NOT NULL,
    target  text        NOT NULL,
    detail  text        NOT NULL DEFAULT ''
);
CREATE INDEX operator_actions_target ON operator_actions (target, id);

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_dedup_claim(text, text, interval) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION usher_enqueue_job(text, jsonb, text, text) SET search_path = %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION usher_dedup_claim(text, text, interval) FROM PUBLIC;
    REVOKE ALL ON FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval) FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE operator_actions;
DROP TABLE kind_pauses;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text DEFAULT NULL, trace text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
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
    INSERT INTO outbox (kind, payload, request_id, trace)
        VALUES (kind, payload, coalesce(request_id, ''), v_trace)
        RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_enqueue_job(text, jsonb, text, text) SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd
DROP FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval);
DROP FUNCTION usher_dedup_claim(text, text, interval);
DROP TABLE job_dedup_keys;

-- +goose Up
-- The plugin boundary. A plugin's statements run on connections whose
-- session user is the plugin's own login role (usher_plugin_<name>), a
-- member of no other role. What the host must do inside the plugin's
-- transaction (record the job id, enqueue) goes through the SECURITY
-- DEFINER functions below: they run as the runtime's owner, check that the
-- calling role (session_user, which no SET ROLE can change) serves the
-- kind, and pin their search_path so a plugin's temporary objects cannot
-- shadow the runtime's tables.

-- Which role serves which kind. The host pins a kind to a plugin's role at
-- load; a plugin that declares a kind pinned to another role is refused.
CREATE TABLE plugin_kinds (
    kind      text        PRIMARY KEY,
    plugin    text        NOT NULL,
    db_role   name        NOT NULL,
    pinned_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX plugin_kinds_role ON plugin_kinds (db_role);

-- Kinds a plugin may enqueue besides its own (its manifest's "enqueues").
CREATE TABLE plugin_enqueues (
    db_role name NOT NULL,
    kind    text NOT NULL,
    PRIMARY KEY (db_role, kind)
);

-- A job identity is recorded per kind: a plugin can record identities of
-- its own kinds only, so it cannot pre-record another plugin's jobs.
ALTER TABLE processed_jobs DROP CONSTRAINT processed_jobs_pkey;
ALTER TABLE processed_jobs ADD PRIMARY KEY (kind, job_id);

-- outbox.enqueued_by: the role whose job enqueued the row (NULL: the
-- application or the host).
ALTER TABLE outbox ADD COLUMN enqueued_by name;

-- +goose StatementBegin
CREATE FUNCTION usher_check_serves(p_kind text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM plugin_kinds WHERE kind = p_kind AND db_role = session_user) THEN
        RAISE EXCEPTION 'role % does not serve kind %', session_user, p_kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The outcome 'applied' of an outbox row of a kind the caller serves, in
-- the job's own transaction, sent with its COMMIT: the effects and the
-- outcome commit together, and done_at is the clock just before.
CREATE FUNCTION usher_applied(p_outbox_id bigint, p_kind text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM usher_check_serves(p_kind);
    IF p_outbox_id IS NOT NULL AND p_outbox_id > 0 THEN
        UPDATE outbox SET done_at = clock_timestamp(), outcome = 'applied'
            WHERE id = p_outbox_id AND kind = p_kind AND done_at IS NULL;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Guard 4: true when this run recorded the identity (it applies), false
-- when it was recorded before (a duplicate).
CREATE FUNCTION usher_record_job(p_job_id text, p_kind text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM usher_check_serves(p_kind);
    INSERT INTO processed_jobs (job_id, kind) VALUES (p_job_id, p_kind)
        ON CONFLICT (kind, job_id) DO NOTHING;
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A follow-on job, from a job of kind p_from_kind the caller serves, to a
-- kind the caller serves or was allowed to enqueue.
CREATE FUNCTION usher_enqueue(p_from_kind text, p_kind text, p_payload jsonb, p_request_id text, p_trace text)
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

-- The commit gate. A job's transaction on a plugin's connection is the
-- host's to end: the host opens a gate in it (a row holding the hash of a
-- key only the host knows), and a deferred constraint trigger refuses to
-- commit while the row is there. Only the host, sending the key with its
-- COMMIT, closes it: a COMMIT sent by the plugin (or COMMIT AND CHAIN, or
-- SET CONSTRAINTS ALL IMMEDIATE) fails, and everything the transaction did
-- is rolled back. Rows live only inside their transaction.
CREATE UNLOGGED TABLE tx_gates (
    txid       xid8  PRIMARY KEY DEFAULT pg_current_xact_id(),
    token_hash bytea NOT NULL
);

-- +goose StatementBegin
CREATE FUNCTION usher_gate_held() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tx_gates WHERE txid = NEW.txid) THEN
        RAISE EXCEPTION 'only the host commits a job''s transaction: the plugin''s commit is refused and everything it did is rolled back'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE CONSTRAINT TRIGGER tx_gate_held AFTER INSERT ON tx_gates
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION usher_gate_held();

-- +goose StatementBegin
CREATE FUNCTION usher_gate_open(p_token_hash bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO tx_gates (token_hash) VALUES (p_token_hash);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION usher_gate_close(p_token bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    DELETE FROM tx_gates WHERE txid = pg_current_xact_id() AND token_hash = sha256(p_token);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the commit gate of this transaction does not open with that key'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Pin every function's search_path to this schema, pg_temp last (a
-- temporary table can never shadow a runtime table), and let only roles
-- the host grants EXECUTE (the plugins') call them.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_check_serves(text)', 'usher_applied(bigint, text)', 'usher_record_job(text, text)',
                             'usher_gate_held()', 'usher_gate_open(bytea)', 'usher_gate_close(bytea)',
                             'usher_enqueue(text, text, jsonb, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE tx_gates;
DROP FUNCTION usher_gate_close(bytea);
DROP FUNCTION usher_gate_open(bytea);
DROP FUNCTION usher_gate_held();
DROP FUNCTION usher_enqueue(text, text, jsonb, text, text);
DROP FUNCTION usher_record_job(text, text);
DROP FUNCTION usher_applied(bigint, text);
DROP FUNCTION usher_check_serves(text);
ALTER TABLE outbox DROP COLUMN enqueued_by;
ALTER TABLE processed_jobs DROP CONSTRAINT processed_jobs_pkey;
ALTER TABLE processed_jobs ADD PRIMARY KEY (job_id);
DROP TABLE plugin_enqueues;
DROP TABLE plugin_kinds;

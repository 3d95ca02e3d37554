-- +goose Up
-- Enqueue from anywhere: usher_enqueue_job adds a job to the outbox in the
-- caller's own transaction, from any language's driver. It runs as the
-- runtime's owner (SECURITY DEFINER), so the caller needs EXECUTE on it
-- and nothing on the outbox. Nobody has EXECUTE but the owner: an operator
-- grants it to the application's role (README, "Enqueue from your
-- application"). Plugin roles never get it (sandbox refuses a plugin role
-- that can call it): a plugin enqueues only through the host's
-- usher_enqueue, which checks the kinds it may enqueue.
-- The limits are internal/jobmsg's (client.Enqueue checks them first); the
-- payload is measured as the relay publishes it (jsonb's text form).
-- +goose StatementBegin
CREATE FUNCTION usher_enqueue_job(kind text, payload jsonb, request_id text DEFAULT NULL, trace text DEFAULT NULL)
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
    REVOKE ALL ON FUNCTION usher_enqueue_job(text, jsonb, text, text) FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- The last time a host found no plugin serving the row's kind and left its
-- entry waiting (host.Config.UnknownKindWait). The reconciler does not
-- republish a row waiting so (its entry is still in the stream), and
-- `host inspect` counts the unfinished ones.
ALTER TABLE outbox ADD COLUMN kind_waited_at timestamptz;
CREATE INDEX outbox_waiting_for_kind ON outbox (kind) WHERE done_at IS NULL AND kind_waited_at IS NOT NULL;

-- +goose Down
DROP INDEX outbox_waiting_for_kind;
ALTER TABLE outbox DROP COLUMN kind_waited_at;
DROP FUNCTION usher_enqueue_job(text, jsonb, text, text);

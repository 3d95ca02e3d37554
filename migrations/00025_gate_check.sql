-- +goose Up
-- The host sends the writes an apply phase returns in one round trip, with
-- this check after each: it fails unless the statement runs inside a
-- transaction whose commit gate is open (see usher_gate_open). A write that
-- ended the host's transaction (ROLLBACK, a failed COMMIT) would otherwise
-- let the writes after it in the same round trip run in a transaction of
-- their own, outside the job's; the check's failure makes the server skip
-- them, and the host refuses the job.
-- +goose StatementBegin
CREATE FUNCTION usher_gate_check() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tx_gates WHERE txid = pg_current_xact_id()) THEN
        RAISE EXCEPTION 'a write ended the host''s transaction: the writes after it are not run'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_gate_check() SET search_path = %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION usher_gate_check() FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION usher_gate_check();

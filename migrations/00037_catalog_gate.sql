-- +goose Up
-- The commit gate also refuses a transaction whose statements changed a
-- role (ALTER ROLE ... PASSWORD, the way a plugin would give itself a
-- login of its own), a role's settings (ALTER ROLE ... SET), role
-- memberships, default privileges, shared comments or security labels, or
-- wrote a large object (lo_from_bytea, lo_import, ...: they persist
-- outside any schema). Any role may change its own password and settings,
-- and a plugin can do it from a DO block or a function as well as by
-- sending the statement, so the refusal is decided from what the database
-- counts: the rows this backend wrote to those catalogs (its pending
-- statistics, which only grow inside a transaction) since the gate
-- opened. Refused, the transaction is rolled back with everything it did,
-- and the change never takes effect.
ALTER TABLE tx_gates ADD COLUMN catalog_writes bigint NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE FUNCTION usher_catalog_writes() RETURNS bigint
LANGUAGE sql AS $$
    SELECT coalesce(pg_catalog.sum(pg_catalog.pg_stat_get_xact_tuples_inserted(c) OPERATOR(pg_catalog.+)
        pg_catalog.pg_stat_get_xact_tuples_updated(c) OPERATOR(pg_catalog.+) pg_catalog.pg_stat_get_xact_tuples_deleted(c)), 0)::pg_catalog.int8
    FROM pg_catalog.unnest(ARRAY['pg_catalog.pg_authid', 'pg_catalog.pg_auth_members', 'pg_catalog.pg_db_role_setting',
        'pg_catalog.pg_default_acl', 'pg_catalog.pg_largeobject', 'pg_catalog.pg_largeobject_metadata',
        'pg_catalog.pg_shdescription', 'pg_catalog.pg_shseclabel', 'pg_catalog.pg_database']::pg_catalog.regclass[]) c
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_gate_open(p_token_hash bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO tx_gates (token_hash, catalog_writes) VALUES (p_token_hash, usher_catalog_writes());
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_gate_close(p_token bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_before bigint;
BEGIN
    DELETE FROM tx_gates WHERE txid = pg_current_xact_id() AND token_hash = sha256(p_token)
        RETURNING catalog_writes INTO v_before;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the commit gate of this transaction does not open with that key'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF usher_catalog_writes() > v_before THEN
        RAISE EXCEPTION 'the plugin''s statements changed a role, its password or settings, a privilege or a large object (the database counts writes to pg_authid, pg_db_role_setting, pg_largeobject, ... in this transaction): refused, and everything the transaction did is rolled back'
            USING ERRCODE = 'UG001';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_catalog_writes()', 'usher_gate_open(bytea)', 'usher_gate_close(bytea)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    REVOKE ALL ON FUNCTION usher_catalog_writes() FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_gate_open(p_token_hash bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO tx_gates (token_hash) VALUES (p_token_hash);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION usher_gate_close(p_token bytea) RETURNS void
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
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['usher_gate_open(bytea)', 'usher_gate_close(bytea)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;
-- +goose StatementEnd
DROP FUNCTION usher_catalog_writes();
ALTER TABLE tx_gates DROP COLUMN catalog_writes;

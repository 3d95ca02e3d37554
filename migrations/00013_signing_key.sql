-- +goose Up
-- Secrets the hosts of one cluster share. The first is the stream signing
-- key: the relay signs every entry with it (HMAC-SHA256) and a consumer
-- dead-letters an entry it does not verify, so a client that can only write
-- to Redis cannot forge a job. The first host to start inserts a random key
-- (INSERT ... ON CONFLICT DO NOTHING, then read back, so hosts starting at
-- once agree); an operator may instead give every host the same key from a
-- file (--signing-key-file), and then this row is not used.
--
-- Only the runtime's owner reads it: nothing is granted to PUBLIC, and the
-- plugin roles are never granted it.
CREATE TABLE runtime_secrets (
    name       text        PRIMARY KEY,
    value      bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON runtime_secrets FROM PUBLIC;

-- +goose Down
DROP TABLE runtime_secrets;

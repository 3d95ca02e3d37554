-- +goose Up
-- The fields of an entry refused before any plugin saw it (malformed, not
-- valid UTF-8, a NUL byte, oversized), exactly as they were received: text
-- columns cannot hold every byte string (they then hold an escaped form),
-- and a dead letter that cannot be written is an entry redelivered for
-- ever. A JSON array, in the entry's field order, of objects
-- {"name": base64, "value": base64, "name_bytes": n, "value_bytes": n}:
-- the lengths are the full ones, larger than the decoded bytes when the
-- entry was over the size limit and only a prefix of it was read. NULL for
-- a letter whose columns hold the entry as it was.
ALTER TABLE dead_letters ADD COLUMN raw jsonb;

-- +goose Down
ALTER TABLE dead_letters DROP COLUMN raw;

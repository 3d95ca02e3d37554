-- +goose Up
-- Grants to the shipped plugins' login roles are not made here: roles are
-- created by an administrator (`host setup`), possibly after this ran, and
-- the runtime's owner has no CREATEROLE. migrations.Up applies the grants
-- in grants.sql (idempotent) after every migration run, to the roles that
-- exist then. This version is kept so databases migrated before the change
-- keep a continuous history.
SELECT 1;

-- +goose Down
SELECT 1;

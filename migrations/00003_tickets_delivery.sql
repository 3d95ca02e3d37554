-- +goose Up
-- A no-op since Stagedoor became an application like any other: its tables
-- (events, orders, tickets, counter_applies) are created by its own
-- migrations (plugins/stagedoor/appdb, `host migrate --stagedoor`), and
-- email_sends by the tickets plugin's, in its schema plugin_tickets. The
-- runtime's migrations hold only the runtime's tables. A database migrated
-- before keeps what this version created (the app's migrations are IF NOT
-- EXISTS); the version stays so that its history is continuous.
SELECT 1;

-- +goose Down
SELECT 1;

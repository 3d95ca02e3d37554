-- +goose Up
-- A Postgres role per shipped plugin. The host runs a plugin's database
-- work (its statements through any handle, and the claim statements built
-- from its claim spec) after SET LOCAL ROLE usher_plugin_<name>, so the
-- database itself refuses a table the plugin was not granted. The host's
-- own statements (processed_jobs, the outbox, dead letters, schedules) run
-- as the host and are never granted to a plugin role.
--
-- Roles are cluster-wide and may already exist (another database of the
-- cluster, or a concurrent migration): they are created only when missing,
-- NOLOGIN, and never dropped by Down. Grants are per database. The user
-- that migrates needs CREATEROLE (or superuser) the first time, and the
-- host's user must be a member of each role to SET ROLE to it; a
-- non-superuser migrating user grants itself membership here.
--
-- Grants are column-exact, taken from the handlers' SQL:
--   counters/update_sales_counter: UPDATE events SET seats_sold ... FROM
--     orders; INSERT INTO counter_applies.
--   tickets/render_tickets: reads orders, events, tickets; UPDATE
--     tickets SET pdf_key (its follow-on enqueue is the host's insert).
--   tickets/send_tickets: reads orders, events, tickets.pdf_key; the claim
--     on email_sends (insert or re-claim, status, mark sent_at, release).

-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['usher_plugin_counters', 'usher_plugin_tickets'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by another database's migration
            END;
        END IF;
        IF NOT pg_has_role(current_user, r, 'MEMBER') THEN
            BEGIN
                EXECUTE format('GRANT %I TO %I', r, current_user);
            EXCEPTION WHEN unique_violation THEN
                NULL; -- granted concurrently
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), r);
    END LOOP;
END
$$;
-- +goose StatementEnd

GRANT SELECT (id, event_id, seats) ON orders TO usher_plugin_counters;
GRANT SELECT (id, seats_sold), UPDATE (seats_sold) ON events TO usher_plugin_counters;
GRANT INSERT (job_id, order_id, plugin_version) ON counter_applies TO usher_plugin_counters;

GRANT SELECT (id, public_id, event_id, buyer, email, created_at) ON orders TO usher_plugin_tickets;
GRANT SELECT (id, name, venue, starts_at) ON events TO usher_plugin_tickets;
GRANT SELECT (id, order_id, code, seat, pdf_key), UPDATE (pdf_key) ON tickets TO usher_plugin_tickets;
GRANT SELECT (order_id, kind, claimed_at, sent_at), INSERT (order_id, kind, claimed_at),
      UPDATE (claimed_at, sent_at) ON email_sends TO usher_plugin_tickets;

-- +goose Down
REVOKE ALL ON orders, events, counter_applies FROM usher_plugin_counters;
REVOKE ALL ON orders, events, tickets, email_sends FROM usher_plugin_tickets;
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM usher_plugin_counters, usher_plugin_tickets', current_schema());
END
$$;
-- +goose StatementEnd

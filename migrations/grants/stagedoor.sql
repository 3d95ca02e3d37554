-- The Stagedoor plugins' grants, column-exact, taken from the handlers' SQL,
-- to whichever of their login roles exist. Applied (idempotently) after
-- every migration run, so a role an administrator creates later gets them
-- at the next host start.
--   counters/update_sales_counter: UPDATE events SET seats_sold ... FROM
--     orders; INSERT INTO counter_applies.
--   tickets/render_tickets: reads orders, events, tickets; UPDATE
--     tickets SET pdf_key (its follow-on enqueue is usher_enqueue's).
--   tickets/send_tickets: reads orders, events, tickets.pdf_key; the claim
--     on email_sends (insert or re-claim, status, mark sent_at with the
--     provider's message id, release).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'usher_plugin_counters') THEN
        GRANT SELECT (id, event_id, seats) ON orders TO usher_plugin_counters;
        GRANT SELECT (id, seats_sold), UPDATE (seats_sold) ON events TO usher_plugin_counters;
        GRANT INSERT (job_id, order_id, plugin_version) ON counter_applies TO usher_plugin_counters;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'usher_plugin_tickets') THEN
        GRANT SELECT (id, public_id, event_id, buyer, email, created_at) ON orders TO usher_plugin_tickets;
        GRANT SELECT (id, name, venue, starts_at) ON events TO usher_plugin_tickets;
        GRANT SELECT (id, order_id, code, seat, pdf_key), UPDATE (pdf_key) ON tickets TO usher_plugin_tickets;
        GRANT SELECT (order_id, kind, claimed_at, sent_at), INSERT (order_id, kind, claimed_at),
              UPDATE (claimed_at, sent_at, provider_message_id) ON email_sends TO usher_plugin_tickets;
    END IF;
END
$$;

-- +goose Up
-- Stagedoor, the ticketing service whose jobs prove the guards. Until
-- the runtime's migrations 00002 and 00003 became no-ops these tables were
-- created there: IF NOT EXISTS keeps such a database's rows where they are.
CREATE TABLE IF NOT EXISTS events (
    id         bigserial   PRIMARY KEY,
    name       text        NOT NULL,
    venue      text        NOT NULL DEFAULT '',
    starts_at  timestamptz NOT NULL DEFAULT now(),
    -- The organizer's sales counter, moved by update_sales_counter.
    seats_sold bigint      NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS orders (
    id         bigserial   PRIMARY KEY,
    public_id  text        NOT NULL UNIQUE,
    event_id   bigint      NOT NULL REFERENCES events (id),
    buyer      text        NOT NULL,
    email      text        NOT NULL,
    seats      integer     NOT NULL CHECK (seats > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS orders_event ON orders (event_id);

CREATE TABLE IF NOT EXISTS tickets (
    id       bigserial PRIMARY KEY,
    order_id bigint    NOT NULL REFERENCES orders (id),
    code     text      NOT NULL UNIQUE,
    seat     text      NOT NULL
);
CREATE INDEX IF NOT EXISTS tickets_order ON tickets (order_id);
-- render_tickets' state: null until the PDF is stored.
ALTER TABLE tickets ADD COLUMN IF NOT EXISTS pdf_key text;

-- One row per applied update_sales_counter, with the plugin version that
-- applied it: tests count effects with it and see which version ran a job.
CREATE TABLE IF NOT EXISTS counter_applies (
    job_id         text        NOT NULL,
    order_id       bigint      NOT NULL,
    plugin_version text        NOT NULL,
    applied_at     timestamptz NOT NULL DEFAULT now()
);
-- Deliberately not unique: a doubled apply must show up as two rows.
CREATE INDEX IF NOT EXISTS counter_applies_job ON counter_applies (job_id);

-- +goose Down
DROP TABLE counter_applies;
DROP TABLE tickets;
DROP TABLE orders;
DROP TABLE events;

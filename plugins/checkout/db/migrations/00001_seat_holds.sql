-- +goose Up
-- reserve_seats' state: one row per order whose seats are held, marked
-- released by release_seats (the checkout's compensation). The plugin's
-- own table, in its schema plugin_checkout: order_id and event_id name
-- Stagedoor rows without a foreign key (that would need a REFERENCES
-- grant, which a plugin does not get).
CREATE TABLE seat_holds (
    order_id    bigint      PRIMARY KEY,
    event_id    bigint      NOT NULL,
    seats       integer     NOT NULL CHECK (seats > 0),
    reserved_at timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz
);

-- Every move of events.seats_held, written by the run whose conditional
-- write won, in its transaction: the audit trail of holds and releases.
-- Deliberately not unique: a doubled move shows as two rows.
CREATE TABLE seat_moves (
    order_id bigint      NOT NULL,
    event_id bigint      NOT NULL,
    delta    integer     NOT NULL,
    job_id   text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX seat_moves_order ON seat_moves (order_id);

-- +goose Down
DROP TABLE seat_moves;
DROP TABLE seat_holds;

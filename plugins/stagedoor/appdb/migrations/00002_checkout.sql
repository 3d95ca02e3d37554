-- +goose Up
-- The checkout workflow (plugins/checkout): the seats its checkouts hold
-- on each event, moved by reserve_seats and release_seats, and the
-- payments that confirm them. The application records a payment and
-- signals the checkout in one transaction (orders.ConfirmPayment).
ALTER TABLE events ADD COLUMN IF NOT EXISTS seats_held bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS payments (
    order_id  bigint      PRIMARY KEY REFERENCES orders (id),
    reference text        NOT NULL UNIQUE,
    paid_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE payments;
ALTER TABLE events DROP COLUMN seats_held;

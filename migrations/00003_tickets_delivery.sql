-- +goose Up
-- render_tickets' state (null until the PDF is stored) and send_tickets'
-- claim row, unique on the effect.
ALTER TABLE tickets ADD COLUMN pdf_key text;

CREATE TABLE email_sends (
    order_id   bigint      NOT NULL REFERENCES orders (id),
    kind       text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    sent_at    timestamptz,
    UNIQUE (order_id, kind)
);

-- +goose Down
DROP TABLE email_sends;
ALTER TABLE tickets DROP COLUMN pdf_key;

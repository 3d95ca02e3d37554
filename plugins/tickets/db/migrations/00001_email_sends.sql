-- +goose Up
-- send_tickets' claim row, unique on the effect, with the mail provider's
-- message id that the mark writes with sent_at (sdk.KeepResult). The
-- plugin's own table, in its schema plugin_tickets: order_id names a
-- Stagedoor order without a foreign key (a key onto the application's
-- table would need a REFERENCES grant, which a plugin does not get).
CREATE TABLE email_sends (
    order_id            bigint      NOT NULL,
    kind                text        NOT NULL,
    claimed_at          timestamptz NOT NULL,
    sent_at             timestamptz,
    provider_message_id text,
    UNIQUE (order_id, kind)
);

-- +goose Down
DROP TABLE email_sends;

-- +goose Up
-- The mail provider's message id of a ticket email, kept by the send's
-- claim effect (sdk.KeepResult) and written with the mark that sets
-- sent_at, in the same statement.
ALTER TABLE email_sends ADD COLUMN provider_message_id text;

-- +goose Down
ALTER TABLE email_sends DROP COLUMN provider_message_id;

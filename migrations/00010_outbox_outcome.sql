-- +goose Up
-- Each outbox row records how its job ended (applied, absorbed, retry
-- scheduled, dead-lettered), written by the host before it acks the entry.
-- A row published long ago with no outcome lost its stream entry (Redis
-- lost data, a failover) or is stuck; the reconciler republishes it and the
-- guards absorb the duplicate. It also makes "every committed outbox row
-- ends as an applied effect or a dead letter" one query.
ALTER TABLE outbox ADD COLUMN done_at timestamptz;
ALTER TABLE outbox ADD COLUMN outcome text;
ALTER TABLE outbox ADD COLUMN republished integer NOT NULL DEFAULT 0;
CREATE INDEX outbox_unfinished ON outbox (published_at) WHERE done_at IS NULL AND published_at IS NOT NULL;

-- +goose Down
DROP INDEX outbox_unfinished;
ALTER TABLE outbox DROP COLUMN republished;
ALTER TABLE outbox DROP COLUMN outcome;
ALTER TABLE outbox DROP COLUMN done_at;

-- +goose Up
-- Recurring schedules (issue 27, item 8): a cron or interval schedule that
-- starts a workflow or enqueues a job once per tick, across every host.
-- The hosts' tickers (host/recurring) take due schedules with FOR UPDATE
-- SKIP LOCKED and, in one transaction, start each tick's workflow (id
-- NAME@TICK, idempotent) or enqueue its job (deduplication key NAME@TICK)
-- and move next_at past the ticks fired: a tick fires once whichever host
-- takes it, and a tick fired again after a crash between the two is
-- absorbed by the id or the key. catch_up says what a schedule due more
-- than once (its hosts were down) fires: 'all' every missed tick, 'one'
-- the latest, 'skip' none but a tick less than a minute late. A runtime
-- table: no plugin role holds any privilege on it.
CREATE TABLE schedules (
    name       text        PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 100),
    target     text        NOT NULL CHECK (target IN ('workflow', 'job')),
    -- The workflow type or the job's kind.
    what       text        NOT NULL,
    input      jsonb       NOT NULL,
    cron       text,
    every      interval,
    catch_up   text        NOT NULL DEFAULT 'one' CHECK (catch_up IN ('all', 'one', 'skip')),
    paused     boolean     NOT NULL DEFAULT false,
    next_at    timestamptz NOT NULL,
    last_tick  timestamptz,
    fired      bigint      NOT NULL DEFAULT 0,
    skipped    bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every IS NULL)),
    CHECK (every IS NULL OR every >= interval '1 second')
);
CREATE INDEX schedules_due ON schedules (next_at) WHERE NOT paused;
REVOKE ALL ON schedules FROM PUBLIC;

-- +goose Down
DROP TABLE schedules;

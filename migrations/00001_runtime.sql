-- +goose Up
-- The runtime's own tables: the outbox, processed job identities (guard 4),
-- delayed runs, dead letters and the per-guard count of absorbed duplicates.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    kind         text        NOT NULL,
    payload      jsonb       NOT NULL,
    request_id   text        NOT NULL DEFAULT '',
    trace        text        NOT NULL DEFAULT '',
    -- The job identity when it is not this row's id: a scheduled run or a
    -- requeued dead letter keeps the identity of the job it continues.
    job_id       text,
    attempt      integer     NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

-- +goose StatementBegin
CREATE FUNCTION usher_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('usher_outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION usher_outbox_notify();

CREATE TABLE processed_jobs (
    job_id       text        PRIMARY KEY,
    kind         text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE scheduled_jobs (
    job_id      text        NOT NULL,
    attempt     integer     NOT NULL,
    kind        text        NOT NULL,
    payload     jsonb       NOT NULL,
    request_id  text        NOT NULL DEFAULT '',
    trace       text        NOT NULL DEFAULT '',
    reason      text        NOT NULL DEFAULT '',
    run_at      timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    enqueued_at timestamptz,
    -- A crash between committing the schedule and acking the entry makes the
    -- redelivery schedule the same (identity, attempt) again: it is absorbed.
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX scheduled_jobs_due ON scheduled_jobs (run_at) WHERE enqueued_at IS NULL;

CREATE TABLE dead_letters (
    id          bigserial   PRIMARY KEY,
    job_id      text        NOT NULL,
    kind        text        NOT NULL,
    payload     bytea       NOT NULL,
    request_id  text        NOT NULL DEFAULT '',
    trace       text        NOT NULL DEFAULT '',
    reason      text        NOT NULL,
    last_error  text        NOT NULL,
    attempts    integer     NOT NULL,
    stream_id   text        NOT NULL,
    history     jsonb       NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    requeued_at timestamptz,
    -- One dead letter per stream entry: dead-lettering it again after a
    -- crash before the ack is absorbed.
    UNIQUE (stream_id)
);
CREATE INDEX dead_letters_open ON dead_letters (kind, id) WHERE requeued_at IS NULL;

CREATE TABLE absorbed_duplicates (
    guard  text   NOT NULL,
    kind   text   NOT NULL,
    reason text   NOT NULL,
    count  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (guard, kind, reason)
);

-- +goose Down
DROP TABLE absorbed_duplicates;
DROP TABLE dead_letters;
DROP TABLE scheduled_jobs;
DROP TABLE processed_jobs;
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION usher_outbox_notify();
DROP TABLE outbox;

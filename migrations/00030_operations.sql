-- +goose Up
-- Operations (issue 12): a row's outcome follows its job to the end, the
-- console's charts read the whole cluster's job history, and plugin swaps
-- are kept where every host sees them.

-- +goose StatementBegin
-- A retry or a requeue is a new outbox row carrying the job's identity:
-- when it gets an outcome, the job's earlier rows that ended waiting for
-- it (retry_scheduled, dead_letter) take that outcome, so every row of a
-- job says how the job ended so far. What each attempt did stays in
-- job_history. Only rows that carry a job_id (a job's later rows) can
-- have earlier ones; the first row of an outbox-born job has job_id NULL.
-- The advisory lock keeps two rows of one job finishing at once from
-- deadlocking on each other's rows.
CREATE FUNCTION usher_outcome_follows_job() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- The job's first row, when its identity is an outbox id.
    v_first bigint := CASE WHEN NEW.job_id ~ '^[0-9]{1,18}$' THEN NEW.job_id::bigint END;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('usher_outcome:' || NEW.job_id));
    UPDATE outbox SET outcome = NEW.outcome
        WHERE id < NEW.id
          AND outcome IN ('retry_scheduled', 'dead_letter')
          AND outcome <> NEW.outcome
          AND (job_id = NEW.job_id OR (job_id IS NULL AND id = v_first));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_outcome_follows_job AFTER UPDATE OF outcome ON outbox
    FOR EACH ROW
    WHEN (NEW.job_id IS NOT NULL AND NEW.outcome IS NOT NULL AND OLD.outcome IS DISTINCT FROM NEW.outcome
          AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION usher_outcome_follows_job();
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION usher_outcome_follows_job() SET search_path = %I, pg_temp', current_schema());
    REVOKE ALL ON FUNCTION usher_outcome_follows_job() FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- The console's charts bucket the history of the last hour by time, kind
-- and verdict: an index-only scan of this index. It also serves the
-- trimmer's oldest-first delete, so it replaces job_history_finished.
CREATE INDEX job_history_chart ON job_history (finished_at) INCLUDE (kind, verdict, guard, started_at);
DROP INDEX job_history_finished;

-- Plugin swaps and rollbacks, one row each, written by the host that did
-- it (each host runs its own plugin processes) after the swap: the
-- console's and `host plugins list`'s swap history, kept for the host's
-- HistoryRetention. Plugin roles hold no privilege on it.
CREATE TABLE plugin_swaps (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    host         text        NOT NULL,
    plugin       text        NOT NULL,
    -- swapped, rolled back or refused.
    action       text        NOT NULL,
    from_version text        NOT NULL DEFAULT '',
    to_version   text        NOT NULL DEFAULT '',
    -- What asked for it: reload, plugin directory change, swap (the
    -- library's Host.Swap), or a rollback's cause (requested, crash_loop,
    -- failures, crashes).
    cause        text        NOT NULL,
    reason       text        NOT NULL DEFAULT '',
    sha256       text        NOT NULL DEFAULT ''
);
CREATE INDEX plugin_swaps_plugin ON plugin_swaps (plugin, at DESC);
CREATE INDEX plugin_swaps_at ON plugin_swaps (at);

-- +goose Down
DROP TABLE plugin_swaps;
CREATE INDEX job_history_finished ON job_history (finished_at);
DROP INDEX job_history_chart;
DROP TRIGGER outbox_outcome_follows_job ON outbox;
DROP FUNCTION usher_outcome_follows_job();

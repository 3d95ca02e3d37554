-- +goose Up
-- Workflow versioning (issue 27): a running workflow is decided by the
-- plugin version that took its first decision (workflows.plugin,
-- plugin_version), even after a hot swap, a rollback or a host restart,
-- on any host. So the binary of every version that serves a workflow type
-- is kept here, under its plugin and version with its SHA-256: a host that
-- must decide for a version it is not running starts it from these bytes
-- (verified against the sum), beside the version it routes new work to,
-- under the same role. A stored version is removed once no running
-- workflow is pinned to it and it is not its plugin's newest (the one
-- retainer, host/retention).
CREATE TABLE workflow_binaries (
    plugin    text        NOT NULL,
    version   text        NOT NULL,
    sha256    text        NOT NULL,
    bytes     bytea       NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plugin, version)
);
REVOKE ALL ON workflow_binaries FROM PUBLIC;
CREATE INDEX workflows_pinned ON workflows (plugin, plugin_version) WHERE state = 'running';

-- `host workflows migrate` records the move of a workflow to another
-- version as an event of its history.
ALTER TABLE workflow_events DROP CONSTRAINT workflow_events_type_check;
ALTER TABLE workflow_events ADD CONSTRAINT workflow_events_type_check
    CHECK (type IN ('started', 'step_scheduled', 'step_completed', 'step_failed',
                    'timer_set', 'timer_fired', 'signal_received', 'cancel_requested',
                    'completed', 'failed', 'cancelled', 'migrated'));

-- +goose Down
ALTER TABLE workflow_events DROP CONSTRAINT workflow_events_type_check;
DELETE FROM workflow_events WHERE type = 'migrated';
ALTER TABLE workflow_events ADD CONSTRAINT workflow_events_type_check
    CHECK (type IN ('started', 'step_scheduled', 'step_completed', 'step_failed',
                    'timer_set', 'timer_fired', 'signal_received', 'cancel_requested',
                    'completed', 'failed', 'cancelled'));
DROP INDEX workflows_pinned;
DROP TABLE workflow_binaries;

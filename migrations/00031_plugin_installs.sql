-- +goose Up
-- What `host plugins install` (and a host loading a plugin from its
-- manifest) last installed of each plugin: its migrations' checksum and
-- the grants it was given, so that a second install with the same
-- manifest changes nothing and a grant dropped from the manifest is
-- revoked. Only the runtime's owner reads or writes it.
CREATE TABLE plugin_installs (
    name              text        PRIMARY KEY,
    version           text        NOT NULL,
    migrations_sha256 text        NOT NULL DEFAULT '',
    grants            jsonb       NOT NULL DEFAULT '[]',
    installed_at      timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON plugin_installs FROM PUBLIC;

-- +goose Down
DROP TABLE plugin_installs;

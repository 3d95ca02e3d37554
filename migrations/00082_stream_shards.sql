-- +goose Up
-- The most shards each stream has been split into (host run
-- --stream-shards). The relay adds a job's entries to one of the shards
-- its host is configured with, and every host reads every shard up to the
-- most any host has used: lowering the setting strands no entry on a
-- shard that nobody reads any more.
CREATE TABLE stream_shards (
    stream     text        PRIMARY KEY,
    shards     int         NOT NULL CHECK (shards BETWEEN 1 AND 256),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE stream_shards;

-- +goose Up
-- Per-kind limits an operator sets (host kinds limit, host/limits): at most
-- concurrency jobs of the kind running at once across every host, at most
-- rate starts a second across every host (a token bucket of burst tokens).
-- A NULL leaves that limit off. Every host reads this table (as it reads
-- kind_pauses) and enforces the limits in Redis; a job held back waits in
-- the stream, its delivery given back, and runs later.
CREATE TABLE kind_limits (
    kind        text             PRIMARY KEY,
    concurrency integer          CHECK (concurrency > 0),
    rate        double precision CHECK (rate > 0),
    burst       integer          CHECK (burst > 0),
    set_at      timestamptz      NOT NULL DEFAULT now(),
    set_by      text             NOT NULL,
    CHECK (concurrency IS NOT NULL OR rate IS NOT NULL),
    CHECK (burst IS NULL OR rate IS NOT NULL)
);

-- +goose Down
DROP TABLE kind_limits;

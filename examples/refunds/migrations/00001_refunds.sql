-- The refunds plugin's own tables, in its own schema (plugin_refunds) when
-- `host plugins install` applies them.

-- +goose Up

-- One claim row per refund: the host inserts it (or re-claims it when not
-- done and older than the lease), and marks it done with the provider's
-- refund id once the provider answered. Unique on exactly the claim's key.
CREATE TABLE refund_claims (
    refund_id          text PRIMARY KEY,
    claimed_at         timestamptz NOT NULL,
    done_at            timestamptz,
    provider_refund_id text
);

CREATE TABLE wallets (
    id            bigint PRIMARY KEY,
    balance_cents bigint NOT NULL DEFAULT 0
);

-- One entry per credit. job_id is deliberately not unique: the job-id
-- guard keeps a credit single, and the tests count entries to prove it.
CREATE TABLE wallet_ledger (
    job_id       text NOT NULL,
    wallet_id    bigint NOT NULL REFERENCES wallets (id),
    amount_cents bigint NOT NULL,
    reason       text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX wallet_ledger_job ON wallet_ledger (job_id);

-- +goose Down
DROP TABLE wallet_ledger;
DROP TABLE wallets;
DROP TABLE refund_claims;

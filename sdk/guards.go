package sdk

import (
	"context"
	"time"
)

// StateFirst is a handler that reaches a state rather than performing an
// action ("make sure order 4471's tickets are rendered"). S carries what Check
// read and Prepare produced into the next phase; it crosses the process
// boundary as JSON, so its fields must be exported.
type StateFirst[T Args, S any] interface {
	// Check reads the current state through a read-only handle. It returns
	// done=true when the state is already reached, and the job ends there.
	Check(ctx context.Context, job Job[T], db *ReadOnly) (state S, done bool, err error)
	// Prepare does the slow work (render, upload) with no transaction open
	// and no database at all. Its output must be derived from the job so
	// that a second Prepare is harmless (a store under a key derived from
	// the order overwrites identical bytes).
	Prepare(ctx context.Context, job Job[T], state S) (S, error)
	// Commit runs inside the host's transaction and must make a
	// conditional write with tx.WriteIf. Only its Win may write further or
	// enqueue follow-on jobs.
	Commit(ctx context.Context, job Job[T], tx *CommitTx, state S) error
}

// Claim declares the row that decides which run owns an effect that has no
// state to read (an email, a charge). The host runs, in one statement:
//
//	INSERT INTO <Table> (<key columns>, <ClaimedColumn>) VALUES (..., now())
//	ON CONFLICT (<key columns>) DO UPDATE SET <ClaimedColumn> = now()
//	WHERE <Table>.<DoneColumn> IS NULL
//	  AND <Table>.<ClaimedColumn> < now() - <Lease>
//	RETURNING <ClaimedColumn>
//
// The table needs a unique constraint on exactly the key columns, a
// timestamptz ClaimedColumn (NOT NULL is fine) and a nullable timestamptz
// DoneColumn, plus the Result columns:
//
//	CREATE TABLE email_sends (
//	    order_id            bigint NOT NULL,
//	    kind                text   NOT NULL,
//	    claimed_at          timestamptz NOT NULL,
//	    sent_at             timestamptz,
//	    provider_message_id text,
//	    PRIMARY KEY (order_id, kind)
//	);
//
// After the effect the host marks the row (UPDATE ... SET <DoneColumn> =
// now(), <Result columns> = ... WHERE <keys> AND <DoneColumn> IS NULL).
// When Effect returns an error (RetryLater, Permanent or a plain error)
// the host releases the claim (<ClaimedColumn> = '-infinity') so the next
// run need not wait out the lease; a crash releases nothing, and the next
// run waits for the lease. These statements run as the plugin's own
// database role, which therefore needs SELECT on the key, claimed and done
// columns, INSERT on the key and claimed columns, and UPDATE on the
// claimed, done and Result columns.
type Claim struct {
	// Table holding one row per effect, e.g. "email_sends".
	Table string
	// Key columns and values, e.g. order_id=4471, kind="tickets".
	Key []Column
	// ClaimedColumn is the claim timestamp column. Default "claimed_at".
	ClaimedColumn string
	// DoneColumn is set by the host after the effect ran. Default "done_at".
	DoneColumn string
	// Lease is how long a claim holds before another run may take it over.
	// Default 2 minutes.
	Lease time.Duration
	// Intent names the effect in the provider's vocabulary, the same on
	// every attempt ("tickets-4471"). The effect's idempotency key is
	// derived from it.
	Intent string
	// Result names the claim row's columns that keep what the effect
	// returns (a provider's message id), e.g. "provider_message_id". The
	// effect passes their values to KeepResult; the host writes them with
	// the mark, in the same statement that marks the effect done.
	Result []string
}

// Column is one key column of a claim row.
type Column struct {
	Name  string
	Value any
}

// DefaultLease is the claim lease when Claim.Lease is zero.
const DefaultLease = 2 * time.Minute

// ClaimEffect is a handler whose effect leaves the process (an email, a
// payment). The host claims the effect's row, calls Effect only when this
// run owns the claim, then marks the row done. If the run crashes between
// the effect and the mark, the next run re-claims after the lease and sends
// again with the same key, which the provider deduplicates.
type ClaimEffect[T Args] interface {
	// Claim declares the claim row from the job alone; it cannot read the
	// database.
	Claim(job Job[T]) (Claim, error)
	// Effect performs the effect. db is read-only; key is derived from the
	// claim's intent and is the only key the provider call path accepts.
	// It is called only when this run owns the claim, and again (with the
	// same key) after a crash between the effect and the mark, or after a
	// lease that ran out while it was still running: the provider's key,
	// not the claim, makes those calls harmless. An error releases the
	// claim (see Claim); nil marks the effect done, with what KeepResult
	// kept.
	Effect(ctx context.Context, job Job[T], db *ReadOnly, key IdempotencyKey) error
}

// RecordJobID is a handler whose effects live in the database and have no
// state to read (a counter). The host inserts the job's identity into
// processed_jobs in the same transaction as Apply's writes; a second run
// finds it and Apply is not called. It protects database effects only.
// Writes whose results Apply does not need are best queued (Tx.Queue):
// they travel with Apply's answer instead of a call to the host each.
type RecordJobID[T Args] interface {
	Apply(ctx context.Context, job Job[T], tx *Tx) error
}

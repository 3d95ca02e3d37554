// Package guard runs a handler's guard protocol. The host, not the plugin,
// opens and commits every transaction, runs the claim statement, records the
// job identity and writes the mark; the plugin is called once per phase with
// a handle that allows exactly what the phase allows.
//
//   - State first: check (read-only handle) → prepare (no handle) → commit
//     (transaction handle; a conditional write must be made, and only a won
//     one unlocks further writes and enqueues).
//   - Claim: the plugin declares the claim row; the host runs the one-statement
//     claim; not claimed and done is success, not claimed and fresh is a retry
//     after the lease; claimed runs the effect (read-only handle and the
//     intent's idempotency key), then the host marks the row done.
//   - Job id recorded: the host records the identity with usher_record_job
//     (an ON CONFLICT DO NOTHING insert into processed_jobs) and calls apply
//     in the same transaction only when it was recorded now.
//
// Every statement of a job, the plugin's and the host's, runs on the
// plugin's own pool (its own login role, see host/sandbox), so the database
// is the sandbox. What a handle allows is decided from what the database
// reports, never from the SQL's text: a read-only phase is a READ ONLY
// transaction refused if it was assigned a transaction id; a commit phase
// may write nothing before its conditional write wins (the transaction's
// own row counts say whether it did); a conditional write wins when its
// command tag is INSERT, UPDATE, DELETE or MERGE with rows affected; after
// every plugin statement the connection must still be inside the host's
// transaction. Every statement is cancelled at the job's deadline.
package guard

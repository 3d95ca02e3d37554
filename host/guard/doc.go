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
//   - Job id recorded: the host inserts the identity into processed_jobs with
//     ON CONFLICT DO NOTHING RETURNING and calls apply in the same
//     transaction only when the insert returned a row.
package guard

// Package sdk is what a handler plugin imports to serve jobs to usher.
//
// usher delivers every job at least once, so sometimes twice: a worker killed
// before its ack, a slow worker whose entry was reclaimed, a relay that
// published and crashed before marking. The SDK makes idempotency the only
// way to write a handler: a kind is registered through exactly one guard, and
// each phase of that guard receives only the capability the phase allows.
//
//   - [HandleStateFirst]: Check reads state through a read-only handle
//     (no transaction held), Prepare does slow work with no database at all,
//     Commit runs in the host's transaction and must make a conditional write
//     ([CommitTx.WriteIf]); follow-on jobs and further writes are only
//     reachable through the [Win] a conditional write returns.
//   - [HandleClaim]: the handler declares a claim row ([Claim]); the host runs
//     the one-statement claim, calls Effect only when the claim was won,
//     then marks the row done (send, then mark). Effect receives an
//     [IdempotencyKey] derived from the claim's intent, the only key the
//     SDK's provider call path ([NewProviderRequest]) accepts.
//   - [HandleRecordJobID]: the host records the job identity in
//     processed_jobs in the same transaction as Apply's writes. This covers
//     database effects only: an email sent from Apply is not protected.
//
// The anti-pattern (check sent_at in one transaction, send, write sent_at in
// another) cannot be written: the phases that may read are read-only, the
// effect phase has no write at all, and the host writes the mark.
//
// A plugin's main is one call:
//
//	func main() {
//		p := sdk.New("counters", "1.0.0")
//		sdk.HandleRecordJobID[SalesCounterArgs](p, salesCounter{})
//		sdk.Serve(p)
//	}
package sdk

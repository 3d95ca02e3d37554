// Package sdk is what a handler plugin imports to serve jobs to usher.
//
// usher delivers every job at least once, so sometimes twice: a worker killed
// before its ack, a slow worker whose entry was reclaimed, a relay that
// published and crashed before marking. A kind is registered through exactly
// one guard, the rule that makes a second run harmless, and each phase of
// that guard receives only the capability the phase allows.
//
// # Which guard
//
//	the effect                                 guard                register with
//	a state you can read and reach once        state first          HandleStateFirst
//	  (a PDF rendered and its key stored)
//	something that leaves the process          a claim row and the  HandleClaim
//	  (an email, a payment, a refund)            provider's key
//	database writes with no state to read      the job id recorded  HandleRecordJobID
//	  (a counter, a ledger entry)                with the writes
//
// What each guard's phases may do:
//
//   - State first ([HandleStateFirst]): Check reads state through a
//     read-only handle (no transaction held) and reports "already done";
//     Prepare does slow work with no database at all; Commit runs in the
//     host's transaction and must make a conditional write
//     ([CommitTx.WriteIf]). Follow-on jobs and further writes are reachable
//     only through the [Win] a conditional write returns, so they happen
//     once however many runs commit.
//   - Claim ([HandleClaim]): the handler declares a claim row ([Claim]) from
//     the job alone; the host runs the one-statement claim, calls Effect
//     only when the claim was won, then marks the row done (send, then
//     mark). Effect receives an [IdempotencyKey] derived from the claim's
//     intent, the only key the SDK's provider call path
//     ([NewProviderRequest]) accepts; the provider deduplicates the send
//     that a crash between send and mark repeats. What the provider answers
//     (a message id) is kept with [KeepResult] into the claim's Result
//     columns, by the same statement as the mark.
//   - Job id recorded ([HandleRecordJobID]): the host records the job
//     identity in processed_jobs in the same transaction as Apply's writes,
//     and a second run never reaches Apply. Writes Apply needs no answer
//     from are best queued ([Tx.Queue]): they travel with Apply's answer,
//     not a call each.
//
// # What the types do not stop
//
// The database handles make the classic anti-pattern (read sent_at, send,
// write sent_at in another transaction) impossible to write through them:
// the phases that may read are read-only, the effect phase has no write,
// and the host writes the mark. Go's types cannot stop a handler from
// calling a provider from Prepare, Commit or Apply, though, or from using
// [KeyForTest] outside tests. Two tools catch that: sdk/sdktest runs each
// handler through every crash point and duplicate the guard allows (a send
// in the wrong phase shows up as two sends), and the usher-vet analyzer
// reports effects outside the effect phase statically (see docs/plugins.md,
// "Vet your plugin").
//
// # Middleware
//
// Tracing, metrics and fault injection wrap handlers from outside: [Use]
// adds a [Middleware] that runs before and after every phase of every kind,
// with that phase's capability and nothing more ([Call]). A shipped plugin
// usually has none; a build of it for tests or chaos is its own main
// package that registers the same handlers and adds its middleware
// (plugins/tickets/chaos in this repository).
//
// # Testing
//
// sdktest.Run(t, sdktest.Case{...}) runs the handler, as its plugin's
// database role with the grants your schema gives it, once cleanly, then
// twice, as two copies at once, and crashed at each step boundary, and
// checks the effects against what the test states (Setup.Want, required),
// one subtest per scenario; Setup.Race adds a second job on the same rows,
// run at once with both reading before either writes, so a lost update
// fails. A
// grant the handler lacks fails the test with the database's refusal, as it
// would fail in production.
//
// # Deploying
//
// A plugin is a binary and a manifest beside it in the host's plugin
// directory: `host plugins manifest BIN --name N --version V --kind K
// --write` starts the binary, checks that it reports that name, version
// and kinds, and writes N.plugin.json with its SHA-256, which the host
// verifies before it starts the binary. Its statements run as the database
// role usher_plugin_<name> (created by `host setup`), which holds only the
// grants you give it on your tables. The plugin process gets nothing of the
// host's environment but PATH, HOME, the locale and TMPDIR, plus what the
// operator passes with `host run --plugin-env NAME[=VALUE]`. A new version
// dropped into the directory is hot-swapped and stays on probation: if it
// crash-loops or fails its jobs, the host rolls back to the previous one.
//
// A plugin's main is one call per kind and Serve:
//
//	func main() {
//		p := sdk.New("counters", "1.0.0")
//		sdk.HandleRecordJobID[SalesCounterArgs](p, salesCounter{})
//		sdk.Serve(p)
//	}
package sdk

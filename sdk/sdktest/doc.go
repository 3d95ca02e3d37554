// Package sdktest proves a handler idempotent in a few lines.
//
// The kit runs the handler in-process against a real Postgres, through the
// host's own guard code (the runner that opens and commits transactions,
// runs the claim and the mark, and the handles that enforce each phase's
// capability), and checks what a single clean run and every scenario
// leave behind against what the test states ([Setup.Want]): a Case that
// states nothing, or states what the database shows before the job runs,
// fails, so a handler that does nothing, or does it twice, cannot pass.
// The scenarios:
//
//   - twice: the job runs, then runs again (a redelivery);
//   - concurrently: two copies run at once (a reclaimed slow worker);
//   - a crash at every step boundary of the handler's guard, then a resume:
//     after check, after prepare, inside commit before and after the
//     conditional write, after commit's phase but before the transaction
//     commits; after the claim, after the effect and before the mark;
//     before and after apply;
//   - with [Setup.Race], another job (its own id and payload) on the same
//     rows: after the first, then at once with each held before its first
//     write (a statement that writes, an enqueue, the writes or the claim
//     its phase hands the host) until the other has done its reads, checked
//     against [Race.Want]. A read-modify-write with neither a conditional
//     write nor a row lock loses an update there; a read FOR UPDATE makes
//     the other job wait for the lock, which the kit sees (pg_locks) and
//     lets the held job go on. A copy that is only slow is waited for (up
//     to 10 s), so the interleaving does not depend on the load.
//
// A claim a crashed or concurrent copy still holds is aged past its lease
// (as time would) rather than waited for, so in the claim guard's
// scenarios the effect may run twice with the same key: they pass only
// when the provider the test talks to honours the key, as a real one must.
//
// A scenario that ends with other effects fails with the step that broke
// idempotency, the stated effects and the ones it left. Effects are
// whatever the author names: rows in the database and effects outside it
// (messages at a provider).
//
// Each scenario gets a fresh database (USHER_TEST_DATABASE_URL, default the
// local "test" database), with usher's migrations, the Stagedoor example's
// tables and the Case's Schema; the plugin's own migrations (Case.Migrations)
// and its grants (Case.Grants) are installed as a host installs a
// manifest's, so a grant the handler lacks fails here as in production.
// A workflow is proved with [RunFlow]: its decisions and steps run through
// the host's decider and guard runner on a fresh database, the test's
// clock skipping to each timer when the workflow waits, the test's
// signals and cancels sent when [FlowSetup.Wait] says; then every step
// and decision task is run twice, and crashed at each point and
// redelivered, each run's state and result compared with the clean run's
// and its effects with [FlowSetup.Want].
//
// sdktest is the one part of the SDK that imports the host: it is the
// host's code path it proves the handler against, and it is only linked
// into tests.
package sdktest

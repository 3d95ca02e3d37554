// Package workflow is the host's side of durable workflows: it answers a
// workflow's decision tasks and fires its timers. A workflow's state is in
// Postgres (migrations/00040_workflows.sql); a decision task is an outbox
// row of the internal kind usher.workflow.<type> (contract.WorkflowKind),
// so it travels the relay, the stream and the job pipeline like any job,
// with reclaim and redelivery unchanged.
//
// A decision is recorded, never replayed: the Decider reads the history,
// sends it to the plugin serving the type (PHASE_DECIDE, no database
// handle), validates the answer, and commits it (the steps as outbox rows
// of their kinds, the timers, the result) in one transaction on the host's
// pool, with the decision's key (workflow, last event seen), the task's
// outbox outcome and its history record. A task delivered again finds its
// decision recorded and is absorbed, as a guard-4 job is. A decision that is
// refused fails the task permanently: its dead letter fails the workflow,
// with the reason (the migration's trigger).
//
// A step's job ends (applied, absorbed, dead-lettered) in the transaction
// that writes its outbox outcome, which records step_completed or
// step_failed and enqueues the next decision task (the same trigger).
//
// What is not built yet: a running workflow is decided by the version now
// serving its type (its first decision's plugin and version are recorded,
// not routed to); finished workflows are kept for ever (no retention
// window); a cancel does not stop steps already scheduled; child
// workflows, schedules and `host workflows migrate` do not exist.
package workflow

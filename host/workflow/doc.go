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
// A running workflow is pinned to the plugin version that took its first
// decision: a decision for it goes to that version (Config.Versions, the
// fleet's pinned versions, started from the binaries stored in
// workflow_binaries) while the route serves another; Decider.Migrate
// moves running workflows to the serving version when it accepts them.
//
// A decision may start child workflows (usherv1.ChildCommand): each is a
// new workflow with its parent recorded, and a step of the parent that the
// workflows_ended trigger ends (with the child's result, or why it
// failed) in the transaction that ends the child. A cancel is asked of a
// workflow's running children too, and a workflow that ends asks its
// running children to cancel.
//
// A cancel asked of a workflow cancels its steps that have not started,
// and a workflow that ends cancels every one that has not (detached ones
// too): a host marks a step started (usher_workflow_step_start, asked
// inside the start every delivery makes, jobctl.Start, before its handler
// is called) and settles the delivery of a cancelled one as cancelled,
// running nothing. Both take the step's row lock, so a step is either
// started or cancelled, never both. The entries of steps carry
// entry.FieldStep, so only they ask about a step.
package workflow

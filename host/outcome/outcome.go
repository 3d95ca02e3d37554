// Package outcome is the one vocabulary for how a delivery of a job was
// settled. The outbox row's outcome, the job history's verdict, the
// console, the CLI and the metrics of settlements all use these values;
// none spells them as literals of its own.
package outcome

// Outcome is how one delivery of a job was settled.
type Outcome string

const (
	// Applied: this delivery applied the job's effect (its outcome was
	// written in the job's own transaction).
	Applied Outcome = "applied"
	// Absorbed: a duplicate; the guard found the effect applied (or being
	// applied) and did nothing.
	Absorbed Outcome = "absorbed"
	// RetryScheduled: a delayed run of the job, with its identity, was
	// committed; the job waits to run again.
	RetryScheduled Outcome = "retry_scheduled"
	// DeadLettered: the job was moved to the dead letters, with why.
	DeadLettered Outcome = "dead_letter"
	// Cancelled: the job was cancelled before it started, by an operator
	// (host/jobctl) or, for a workflow step, by its workflow (asked to
	// cancel, or ended); no handler ran and none will.
	Cancelled Outcome = "cancelled"
	// Abandoned: the delivery did not finish (its plugin crashed or was
	// not running, the database was unreachable, its host stopped); the
	// entry stays pending and runs again. Never an outbox row's outcome.
	Abandoned Outcome = "abandoned"
)

// All lists every outcome, in the order a job's life reads.
var All = []Outcome{Applied, Absorbed, RetryScheduled, DeadLettered, Cancelled, Abandoned}

// Final reports whether o ends the job: an outbox row holding it is
// settled for good (a retry_scheduled row waits for the job's next run).
func (o Outcome) Final() bool {
	return o == Applied || o == Absorbed || o == DeadLettered || o == Cancelled
}

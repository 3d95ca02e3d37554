package workflow

import (
	"context"
	"time"

	"github.com/usherhq/usher/host/guard"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Guards runs the guards of effects (guard.Runner).
type Guards interface {
	Run(ctx context.Context, inv guard.Invoker, db guard.DB, g usherv1.Guard, job *usherv1.Job, d guard.Delivery) guard.Outcome
	Backoff(attempt int32) time.Duration
}

// Runner is the job pipeline's runner: a kind served under the workflow
// guard is a decision task, answered by the Decider; every other kind runs
// its guard, unchanged.
type Runner struct {
	Guards  Guards
	Decider *Decider
	// OnAbsorbed, when set, is told of every decision task absorbed.
	OnAbsorbed func(g usherv1.Guard, kind, reason string)
}

// Run runs job.
func (r Runner) Run(ctx context.Context, inv guard.Invoker, db guard.DB, g usherv1.Guard, job *usherv1.Job, d guard.Delivery) guard.Outcome {
	if g != usherv1.Guard_GUARD_WORKFLOW {
		return r.Guards.Run(ctx, inv, db, g, job, d)
	}
	out := r.Decider.Decide(ctx, inv, db, job, d)
	if out.Verdict == guard.Absorbed && r.OnAbsorbed != nil {
		r.OnAbsorbed(g, job.GetKind(), out.Reason)
	}
	return out
}

// Backoff is the guards' backoff.
func (r Runner) Backoff(attempt int32) time.Duration { return r.Guards.Backoff(attempt) }

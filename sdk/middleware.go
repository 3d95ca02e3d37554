package sdk

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// Phase names one phase of a guard.
type Phase string

// The phases, by guard: state first has Check, Prepare and Commit; claim has
// Claim and Effect; job id recorded has Apply.
const (
	PhaseCheck   Phase = "check"
	PhasePrepare Phase = "prepare"
	PhaseCommit  Phase = "commit"
	PhaseClaim   Phase = "claim"
	PhaseEffect  Phase = "effect"
	PhaseApply   Phase = "apply"
)

// Call is one phase of one job, as a [Middleware] sees it. It carries the
// same capability the handler's phase receives and nothing more: a
// middleware wrapping Check gets the read-only handle, one wrapping Prepare
// or Claim gets no database at all, one wrapping Commit gets the commit
// transaction (whose only way to write is a conditional write), one
// wrapping Apply gets the job's transaction. The effect phase's
// [IdempotencyKey] is not passed: a middleware has no provider to call.
type Call struct {
	// Kind, Phase and the job's identity and metadata (see [Job]).
	Kind      string
	Phase     Phase
	JobID     string
	Attempt   int
	RequestID string
	Trace     string
	// Args is the decoded payload: the handler's T, as a value.
	Args any
	// Log is the job's logger, the same as Job.Log.
	Log *slog.Logger

	// ReadOnly is set in Check and Effect.
	ReadOnly *ReadOnly
	// CommitTx is set in Commit.
	CommitTx *CommitTx
	// Tx is set in Apply. Statements a middleware queues on it
	// ([Tx.Queue]) run in the job's transaction with the handler's, and
	// are dropped with them when the phase fails.
	Tx *Tx
}

// Middleware wraps every phase call of every handler of a plugin, from
// outside: tracing, metrics, fault injection in a test build. It runs code
// before and after next, which runs the rest of the chain and then the
// handler's phase; it may return an error instead of calling next (the
// phase then fails as if the handler had returned that error), or replace
// the error next returned. It cannot change what the phase produced (the
// state, "already done", the claim row, an effect's result).
//
// A middleware is held to the guard rules as a handler is: it receives only
// the phase's capability ([Call]), the host checks every statement it makes
// against the phase, and a panic in it fails the job as a handler's does.
// What Go's types cannot stop (a network call or a file write from a phase
// that must have no effect) is as much a mistake in a middleware as in a
// handler, and worse, since a middleware runs in every phase: usher-vet
// reports any effect a middleware reaches (sdk/analysis/effectcheck).
//
// next runs the phase at most once: a second call fails the job
// permanently instead of running the handler again.
//
// A middleware must be safe for concurrent use: a plugin runs many phases
// at once.
type Middleware interface {
	Wrap(ctx context.Context, call *Call, next func(context.Context) error) error
}

// MiddlewareFunc adapts a function to [Middleware].
type MiddlewareFunc func(ctx context.Context, call *Call, next func(context.Context) error) error

// Wrap calls f.
func (f MiddlewareFunc) Wrap(ctx context.Context, call *Call, next func(context.Context) error) error {
	return f(ctx, call, next)
}

// Use adds middleware to every kind of p, registered before or after the
// call. The first middleware added is the outermost: it runs first before
// the phase and last after it. A shipped plugin usually uses none; a build
// of it for tests or chaos (its own main package) adds its own.
func Use(p *Plugin, mw ...Middleware) {
	p.middleware = append(p.middleware, mw...)
}

// around runs phase through p's middleware. call's metadata comes from job.
func around[T Args](ctx context.Context, mw []Middleware, job Job[T], call Call, phase func(context.Context) error) error {
	if len(mw) == 0 {
		return phase(ctx)
	}
	call.Kind, call.JobID, call.Attempt = job.Kind, job.ID, job.Attempt
	call.RequestID, call.Trace, call.Args, call.Log = job.RequestID, job.Trace, job.Args, job.Log
	var ran atomic.Bool
	next := func(ctx context.Context) error {
		if ran.Swap(true) {
			return Permanent(fmt.Errorf("sdk: a middleware ran the %s phase of %s job %s twice", call.Phase, call.Kind, call.JobID))
		}
		return phase(ctx)
	}
	for i := len(mw) - 1; i >= 0; i-- {
		m, inner := mw[i], next
		next = func(ctx context.Context) error { return m.Wrap(ctx, &call, inner) }
	}
	return next(ctx)
}

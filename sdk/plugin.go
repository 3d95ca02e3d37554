package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sort"
	"time"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Plugin is a set of job kinds served by one plugin binary, each registered
// through exactly one guard.
type Plugin struct {
	name    string
	version string
	kinds   map[string]kindHandler
	errs    []error
	// logger receives records not tied to a job (stderr, which go-plugin
	// forwards to the host's log).
	logger *slog.Logger
	// middleware wraps every phase of every kind (Use).
	middleware []Middleware
}

// New starts a plugin description. name and version appear in the manifest
// the host reads before routing any job to the plugin.
func New(name, version string) *Plugin {
	return &Plugin{name: name, version: version, kinds: map[string]kindHandler{}}
}

// kindHandler is a registered kind with its guard, type-erased.
type kindHandler interface {
	info() *usherv1.KindInfo
	invoke(ctx context.Context, env invokeEnv, call *usherv1.Call) *usherv1.Result
}

// invokeEnv is what a phase call needs from the plugin process.
type invokeEnv struct {
	host       hostCaller
	logger     func(job *usherv1.Job) *slog.Logger
	middleware []Middleware
}

func (p *Plugin) add(kind string, h kindHandler) {
	switch {
	case kind == "":
		p.errs = append(p.errs, fmt.Errorf("sdk: a handler's Args.Kind() returned an empty kind"))
	case p.kinds[kind] != nil:
		p.errs = append(p.errs, fmt.Errorf("sdk: kind %q registered twice: a kind has exactly one guard", kind))
	default:
		p.kinds[kind] = h
	}
}

// Kinds lists the registered kinds in order.
func (p *Plugin) Kinds() []string {
	out := make([]string, 0, len(p.kinds))
	for k := range p.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Err reports registration mistakes (an empty or duplicated kind).
func (p *Plugin) Err() error { return errors.Join(p.errs...) }

func (p *Plugin) manifest() *usherv1.ManifestResponse {
	m := &usherv1.ManifestResponse{Name: p.name, Version: p.version, ProtocolVersion: contract.ProtocolVersion}
	for _, k := range p.Kinds() {
		m.Kinds = append(m.Kinds, p.kinds[k].info())
	}
	return m
}

func kindInfo[T Args](guard usherv1.Guard) *usherv1.KindInfo {
	var zero T
	schema := 1
	if v, ok := any(zero).(SchemaVersioned); ok {
		schema = v.SchemaVersion()
	}
	return &usherv1.KindInfo{Kind: zero.Kind(), Guard: guard, PayloadSchemaVersion: int32(schema)}
}

// HandleStateFirst registers h for T's kind under the state-first guard.
func HandleStateFirst[T Args, S any](p *Plugin, h StateFirst[T, S]) {
	info := kindInfo[T](usherv1.Guard_GUARD_STATE_FIRST)
	p.add(info.Kind, &stateFirstKind[T, S]{h: h, ki: info})
}

// HandleClaim registers h for T's kind under the claim guard.
func HandleClaim[T Args](p *Plugin, h ClaimEffect[T]) {
	info := kindInfo[T](usherv1.Guard_GUARD_CLAIM)
	p.add(info.Kind, &claimKind[T]{h: h, ki: info})
}

// HandleRecordJobID registers h for T's kind under the job-id guard.
func HandleRecordJobID[T Args](p *Plugin, h RecordJobID[T]) {
	info := kindInfo[T](usherv1.Guard_GUARD_JOB_ID)
	p.add(info.Kind, &jobIDKind[T]{h: h, ki: info})
}

func decodeJob[T Args](env invokeEnv, pj *usherv1.Job) (Job[T], error) {
	var args T
	if err := json.Unmarshal(pj.GetPayload(), &args); err != nil {
		return Job[T]{}, Permanent(fmt.Errorf("payload of %s job %s does not parse: %w", pj.GetKind(), pj.GetId(), err))
	}
	return Job[T]{
		ID: pj.GetId(), Kind: pj.GetKind(), Attempt: int(pj.GetAttempt()),
		RequestID: pj.GetRequestId(), Trace: pj.GetTrace(), Args: args,
		Log: env.logger(pj),
	}, nil
}

func wrongPhase(call *usherv1.Call, guard string) *usherv1.Result {
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT,
		Error: fmt.Sprintf("phase %s is not a phase of the %s guard", call.GetPhase(), guard)}
}

// result maps a handler's error onto the wire outcome.
func result(err error) *usherv1.Result {
	if err == nil {
		return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK}
	}
	var rl *RetryLaterError
	if errors.As(err, &rl) {
		return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_RETRY_LATER, RetryAfterMs: rl.Delay.Milliseconds(), Error: err.Error()}
	}
	var perm *PermanentError
	if errors.As(err, &perm) {
		return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: err.Error()}
	}
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_ERROR, Error: err.Error()}
}

// safely runs one phase, turning a panic into a permanent failure so one bad
// job cannot take the plugin (and every other job in flight) down with it.
func safely(kind string, f func() *usherv1.Result) (res *usherv1.Result) {
	defer func() {
		if r := recover(); r != nil {
			res = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT,
				Error: fmt.Sprintf("handler for %s panicked: %v\n%s", kind, r, debug.Stack())}
		}
	}()
	return f()
}

type stateFirstKind[T Args, S any] struct {
	h  StateFirst[T, S]
	ki *usherv1.KindInfo
}

func (k *stateFirstKind[T, S]) info() *usherv1.KindInfo { return k.ki }

func (k *stateFirstKind[T, S]) invoke(ctx context.Context, env invokeEnv, call *usherv1.Call) *usherv1.Result {
	job, err := decodeJob[T](env, call.GetJob())
	if err != nil {
		return result(err)
	}
	var state S
	if len(call.GetState()) > 0 {
		if err := json.Unmarshal(call.GetState(), &state); err != nil {
			return result(Permanent(fmt.Errorf("state from the previous phase does not decode: %w", err)))
		}
	}
	h := handle{host: env.host, id: call.GetHandle()}
	switch call.GetPhase() {
	case usherv1.Phase_PHASE_CHECK:
		db := &ReadOnly{h: h}
		var st S
		var done bool
		err := around(ctx, env.middleware, job, Call{Phase: PhaseCheck, ReadOnly: db}, func(ctx context.Context) (err error) {
			st, done, err = k.h.Check(ctx, job, db)
			return err
		})
		if err != nil {
			return result(err)
		}
		if done {
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_DONE}
		}
		return withState(st)
	case usherv1.Phase_PHASE_PREPARE:
		var st S
		err := around(ctx, env.middleware, job, Call{Phase: PhasePrepare}, func(ctx context.Context) (err error) {
			st, err = k.h.Prepare(ctx, job, state)
			return err
		})
		if err != nil {
			return result(err)
		}
		return withState(st)
	case usherv1.Phase_PHASE_COMMIT:
		tx := &CommitTx{h: h}
		return result(around(ctx, env.middleware, job, Call{Phase: PhaseCommit, CommitTx: tx}, func(ctx context.Context) error {
			return k.h.Commit(ctx, job, tx, state)
		}))
	default:
		return wrongPhase(call, "state-first")
	}
}

func withState(st any) *usherv1.Result {
	b, err := json.Marshal(st)
	if err != nil {
		return result(Permanent(fmt.Errorf("state does not encode: %w", err)))
	}
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, State: b}
}

type claimKind[T Args] struct {
	h  ClaimEffect[T]
	ki *usherv1.KindInfo
}

func (k *claimKind[T]) info() *usherv1.KindInfo { return k.ki }

func (k *claimKind[T]) invoke(ctx context.Context, env invokeEnv, call *usherv1.Call) *usherv1.Result {
	job, err := decodeJob[T](env, call.GetJob())
	if err != nil {
		return result(err)
	}
	switch call.GetPhase() {
	case usherv1.Phase_PHASE_CLAIM:
		var c Claim
		err := around(ctx, env.middleware, job, Call{Phase: PhaseClaim}, func(context.Context) (err error) {
			c, err = k.h.Claim(job)
			return err
		})
		if err != nil {
			return result(err)
		}
		spec, err := claimSpec(c)
		if err != nil {
			return result(Permanent(err))
		}
		return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Claim: spec}
	case usherv1.Phase_PHASE_EFFECT:
		key, err := intentKey(call.GetIdempotencyKey())
		if err != nil {
			return result(Permanent(err))
		}
		// Claim is a pure function of the job: it names the columns
		// the effect's result goes to.
		kept := &effectResult{}
		if c, err := k.h.Claim(job); err == nil {
			kept.columns = c.Result
		}
		db := &ReadOnly{h: handle{host: env.host, id: call.GetHandle()}}
		res := result(around(context.WithValue(ctx, resultKey{}, kept), env.middleware, job, Call{Phase: PhaseEffect, ReadOnly: db},
			func(ctx context.Context) error { return k.h.Effect(ctx, job, db, key) }))
		if res.GetOutcome() == usherv1.Outcome_OUTCOME_OK {
			res.EffectResult = kept.values
		}
		return res
	default:
		return wrongPhase(call, "claim")
	}
}

type jobIDKind[T Args] struct {
	h  RecordJobID[T]
	ki *usherv1.KindInfo
}

func (k *jobIDKind[T]) info() *usherv1.KindInfo { return k.ki }

func (k *jobIDKind[T]) invoke(ctx context.Context, env invokeEnv, call *usherv1.Call) *usherv1.Result {
	job, err := decodeJob[T](env, call.GetJob())
	if err != nil {
		return result(err)
	}
	if call.GetPhase() != usherv1.Phase_PHASE_APPLY {
		return wrongPhase(call, "job-id")
	}
	tx := &Tx{h: handle{host: env.host, id: call.GetHandle()}}
	err = around(ctx, env.middleware, job, Call{Phase: PhaseApply, Tx: tx}, func(ctx context.Context) error {
		return k.h.Apply(ctx, job, tx)
	})
	if err == nil {
		err = tx.err
	}
	res := result(err)
	if err == nil {
		res.Writes = tx.queued
	}
	return res
}

// lease returns the claim's lease, defaulted.
func (c Claim) lease() time.Duration {
	if c.Lease <= 0 {
		return DefaultLease
	}
	return c.Lease
}

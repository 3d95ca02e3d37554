package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

type mwArgs struct {
	N int `json:"n"`
}

func (mwArgs) Kind() string { return "mw_job" }

// trace records, in order, what the handlers and middleware ran.
type trace struct {
	mu    sync.Mutex
	lines []string
}

func (tr *trace) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

type mwStateFirst struct{ tr *trace }

func (h mwStateFirst) Check(ctx context.Context, job Job[mwArgs], db *ReadOnly) (int, bool, error) {
	h.tr.add("check")
	return job.Args.N, false, nil
}

func (h mwStateFirst) Prepare(ctx context.Context, job Job[mwArgs], n int) (int, error) {
	h.tr.add("prepare %d", n)
	return n + 1, nil
}

func (h mwStateFirst) Commit(ctx context.Context, job Job[mwArgs], tx *CommitTx, n int) error {
	h.tr.add("commit %d", n)
	return nil
}

type mwApply struct {
	tr  *trace
	err error
}

func (h mwApply) Apply(ctx context.Context, job Job[mwArgs], tx *Tx) error {
	h.tr.add("apply")
	tx.Queue(Statement{SQL: "UPDATE handler"})
	return h.err
}

func invokeOne(t *testing.T, p *Plugin, phase usherv1.Phase, state []byte) *usherv1.Result {
	t.Helper()
	env := invokeEnv{logger: func(*usherv1.Job) *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) },
		middleware: p.middleware}
	call := &usherv1.Call{Phase: phase, Handle: "h", State: state,
		Job: &usherv1.Job{Id: "17", Kind: "mw_job", Attempt: 2, Payload: []byte(`{"n":41}`)}}
	return safely("mw_job", func() *usherv1.Result { return p.kinds["mw_job"].invoke(context.Background(), env, call) })
}

// Each phase runs inside every middleware, first added outermost, and each
// middleware sees the job and only its phase's capability.
func TestMiddlewareWrapsEveryPhase(t *testing.T) {
	t.Parallel()
	tr := &trace{}
	p := New("p", "1")
	HandleStateFirst[mwArgs](p, mwStateFirst{tr: tr})
	for _, name := range []string{"outer", "inner"} {
		Use(p, MiddlewareFunc(func(ctx context.Context, c *Call, next func(context.Context) error) error {
			tr.add("%s before %s %s/%s attempt %d args %v ro=%t commit=%t tx=%t", name, c.Phase, c.Kind, c.JobID, c.Attempt, c.Args,
				c.ReadOnly != nil, c.CommitTx != nil, c.Tx != nil)
			err := next(ctx)
			tr.add("%s after %s err=%v", name, c.Phase, err)
			return err
		}))
	}

	res := invokeOne(t, p, usherv1.Phase_PHASE_CHECK, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_OK, res.GetOutcome(), res.GetError())
	require.JSONEq(t, `41`, string(res.GetState()), "the state the handler returned passes through")
	res = invokeOne(t, p, usherv1.Phase_PHASE_PREPARE, res.GetState())
	require.JSONEq(t, `42`, string(res.GetState()))
	res = invokeOne(t, p, usherv1.Phase_PHASE_COMMIT, res.GetState())
	require.Equal(t, usherv1.Outcome_OUTCOME_OK, res.GetOutcome(), res.GetError())

	require.Equal(t, []string{
		"outer before check mw_job/17 attempt 2 args {41} ro=true commit=false tx=false",
		"inner before check mw_job/17 attempt 2 args {41} ro=true commit=false tx=false",
		"check",
		"inner after check err=<nil>",
		"outer after check err=<nil>",
		"outer before prepare mw_job/17 attempt 2 args {41} ro=false commit=false tx=false",
		"inner before prepare mw_job/17 attempt 2 args {41} ro=false commit=false tx=false",
		"prepare 41",
		"inner after prepare err=<nil>",
		"outer after prepare err=<nil>",
		"outer before commit mw_job/17 attempt 2 args {41} ro=false commit=true tx=false",
		"inner before commit mw_job/17 attempt 2 args {41} ro=false commit=true tx=false",
		"commit 42",
		"inner after commit err=<nil>",
		"outer after commit err=<nil>",
	}, tr.lines)
}

// A middleware's writes in Apply travel with the handler's, and both are
// dropped when the phase fails, whoever failed it.
func TestMiddlewareWritesShareTheJobsFate(t *testing.T) {
	t.Parallel()
	record := MiddlewareFunc(func(ctx context.Context, c *Call, next func(context.Context) error) error {
		if err := next(ctx); err != nil {
			return err
		}
		c.Tx.Queue(Statement{SQL: "INSERT middleware"})
		return nil
	})
	failAfter := MiddlewareFunc(func(ctx context.Context, c *Call, next func(context.Context) error) error {
		if err := next(ctx); err != nil {
			return err
		}
		return errors.New("injected after apply")
	})
	sqls := func(res *usherv1.Result) []string {
		var out []string
		for _, w := range res.GetWrites() {
			out = append(out, w.GetSql())
		}
		return out
	}

	p := New("p", "1")
	HandleRecordJobID[mwArgs](p, mwApply{tr: &trace{}})
	Use(p, record)
	res := invokeOne(t, p, usherv1.Phase_PHASE_APPLY, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_OK, res.GetOutcome(), res.GetError())
	require.Equal(t, []string{"UPDATE handler", "INSERT middleware"}, sqls(res))

	p = New("p", "1")
	HandleRecordJobID[mwArgs](p, mwApply{tr: &trace{}, err: errors.New("handler failed")})
	Use(p, record)
	res = invokeOne(t, p, usherv1.Phase_PHASE_APPLY, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_ERROR, res.GetOutcome())
	require.Empty(t, res.GetWrites())

	p = New("p", "1")
	HandleRecordJobID[mwArgs](p, mwApply{tr: &trace{}})
	Use(p, failAfter, record) // record queues, then the outer one fails the phase
	res = invokeOne(t, p, usherv1.Phase_PHASE_APPLY, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_ERROR, res.GetOutcome())
	require.Equal(t, "injected after apply", res.GetError())
	require.Empty(t, res.GetWrites())
}

// A middleware may stop a phase before the handler, and cannot run it twice.
func TestMiddlewareStopsButCannotRepeat(t *testing.T) {
	t.Parallel()
	tr := &trace{}
	p := New("p", "1")
	HandleRecordJobID[mwArgs](p, mwApply{tr: tr})
	Use(p, MiddlewareFunc(func(ctx context.Context, c *Call, next func(context.Context) error) error {
		return Permanent(errors.New("refused before apply"))
	}))
	res := invokeOne(t, p, usherv1.Phase_PHASE_APPLY, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, res.GetOutcome())
	require.Empty(t, tr.lines, "the handler did not run")

	p = New("p", "1")
	HandleRecordJobID[mwArgs](p, mwApply{tr: tr})
	Use(p, MiddlewareFunc(func(ctx context.Context, c *Call, next func(context.Context) error) error {
		_ = next(ctx)
		return next(ctx)
	}))
	res = invokeOne(t, p, usherv1.Phase_PHASE_APPLY, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, res.GetOutcome())
	require.Contains(t, res.GetError(), "ran the apply phase of mw_job job 17 twice")
	require.Equal(t, []string{"apply"}, tr.lines)

	// A panic in a middleware fails the job as a handler's panic does.
	p = New("p", "1")
	HandleRecordJobID[mwArgs](p, mwApply{tr: &trace{}})
	Use(p, MiddlewareFunc(func(context.Context, *Call, func(context.Context) error) error { panic("boom") }))
	res = invokeOne(t, p, usherv1.Phase_PHASE_APPLY, nil)
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, res.GetOutcome())
	require.Contains(t, res.GetError(), "panicked: boom")
}

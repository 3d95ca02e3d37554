package guard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// gatedStateFirst is a state-first plugin behind a pluginhost.Gate, as the
// supervisor puts one: its check reads through its handle, its commit
// writes conditionally; a phase listed in hold waits for its channel.
type gatedStateFirst struct {
	gate *pluginhost.Gate
	hs   *guard.Handles
	hold map[string]chan struct{} // "<job>.<phase>"
	mu   sync.Mutex
	done map[string]bool // "<job>.<phase>" answered
}

func (g *gatedStateFirst) Hold(ctx context.Context) (context.Context, func(), error) {
	return g.gate.Hold(ctx)
}

func (g *gatedStateFirst) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	ctx, release, err := g.gate.Hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	c := calls[0]
	phase := map[usherv1.Phase]string{usherv1.Phase_PHASE_CHECK: "check", usherv1.Phase_PHASE_PREPARE: "prepare",
		usherv1.Phase_PHASE_COMMIT: "commit"}[c.GetPhase()]
	key := c.GetJob().GetId() + "." + phase
	if ch := g.hold[key]; ch != nil {
		<-ch
	}
	var st *usherv1.Statement
	switch phase {
	case "check":
		st = &usherv1.Statement{Mode: usherv1.Mode_MODE_QUERY, Sql: `SELECT n FROM gcount WHERE id = 0`}
	case "commit":
		st = &usherv1.Statement{Mode: usherv1.Mode_MODE_WRITE_IF, Sql: `UPDATE gcount SET n = n + 1 WHERE id = 0 RETURNING n`}
	}
	if st != nil {
		if _, err := g.hs.Exec(ctx, &usherv1.ExecRequest{Handle: c.GetHandle(), Statements: []*usherv1.Statement{st}}); err != nil {
			return []*usherv1.Result{{Outcome: usherv1.Outcome_OUTCOME_ERROR, Error: err.Error()}}, nil
		}
	}
	g.mu.Lock()
	g.done[key] = true
	g.mu.Unlock()
	return []*usherv1.Result{{Outcome: usherv1.Outcome_OUTCOME_OK}}, nil
}

func (g *gatedStateFirst) answered(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done[key]
}

// The plugin's pool has one connection. Job c is in its check (holding the
// gate, about to read), job a in its prepare, and job b, a rerun after a
// crash, waits to run alone. a then opens its transaction (the pool's one
// connection) and commits; c reads. When the gate was taken per call, a
// waited at it for its commit behind b, b waited for c, and c waited for
// the connection a held: a cycle that only the jobs' deadlines broke (in
// make demo, with the pool of four and a crash, about one run in three).
// Held for a whole job from before its first connection, all three apply.
func TestGateHeldForTheWholeJob(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, "")
	db.Pool = hosttest.RawPool(t, owner, 1)
	hs := guard.NewHandles("public", nil)
	runner, err := guard.NewRunner(guard.Config{Handles: hs})
	require.NoError(t, err)
	cGo, aGo := make(chan struct{}), make(chan struct{})
	inv := &gatedStateFirst{gate: pluginhost.NewGate(), hs: hs,
		hold: map[string]chan struct{}{"c.check": cGo, "a.prepare": aGo}, done: map[string]bool{}}

	runs := newJobRuns(runner, inv, db)
	runs.timeout = 10 * time.Second
	run := func(id string, alone bool) { runs.startAs(id, usherv1.Guard_GUARD_STATE_FIRST, alone) }
	run("c", false)
	run("a", false)
	hosttest.Eventually(t, 5*time.Second, "a checked, now in its prepare", func() bool { return inv.answered("a.check") })
	run("b", true)
	time.Sleep(100 * time.Millisecond) // b waits to run alone
	close(aGo)
	hosttest.Eventually(t, 5*time.Second, "a holding the pool's connection, or done", func() bool {
		return db.Pool.Stat().AcquiredConns() == 1 || runs.finished("a")
	})
	close(cGo)
	outs := runs.wait()
	for _, id := range []string{"a", "b", "c"} {
		require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %s", id, outs[id].Reason)
	}
	require.EqualValues(t, 3, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))
}

// A batch whose opening fails (here its records: one job's kind is not
// the plugin's) runs its jobs again alone, and gives its connection back
// first: holding it, the jobs run alone waited for it until their
// deadline on a pool of one.
func TestBatchThatCannotOpenGivesBackItsConnection(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, "")
	db.Pool = hosttest.RawPool(t, owner, 1)
	hs := guard.NewHandles("public", nil)
	runner, err := guard.NewRunner(guard.Config{Handles: hs, BatchMax: 32})
	require.NoError(t, err)
	unblock := make(chan struct{})
	inv := &callbackInvoker{hs: hs, wait: map[string]chan struct{}{"blocker": unblock}, refused: map[string]codes.Code{}}

	runs := newJobRuns(runner, inv, db)
	runs.timeout = 10 * time.Second
	run := func(id, kind string) {
		runs.startJob(&usherv1.Job{Id: id, Kind: kind}, usherv1.Guard_GUARD_JOB_ID, false)
	}
	// The blocker's run holds the pool while the others queue for one
	// batch.
	run("blocker", "raw_job")
	time.Sleep(50 * time.Millisecond)
	run("a", "raw_job")
	run("foreign", "not_this_plugins_job")
	run("b", "raw_job")
	time.Sleep(50 * time.Millisecond)
	close(unblock)
	outs := runs.wait()
	for _, id := range []string{"blocker", "a", "b"} {
		require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %s", id, outs[id].Reason)
	}
	require.NotEqual(t, guard.Applied, outs["foreign"].Verdict)
	require.NotContains(t, outs["foreign"].Reason, "deadline", "the foreign job ended on its own error, not its deadline")
	require.EqualValues(t, 3, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))
}

// gatedBatchInvoker applies each job by a statement sent back through the
// host, behind a pluginhost.Gate taken per call as the supervisor takes
// it; before is called first, with the call's jobs.
type gatedBatchInvoker struct {
	*callbackInvoker
	gate   *pluginhost.Gate
	before func(calls []*usherv1.Call)
}

func (g *gatedBatchInvoker) Hold(ctx context.Context) (context.Context, func(), error) {
	return g.gate.Hold(ctx)
}

func (g *gatedBatchInvoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	g.before(calls)
	ctx, release, err := g.gate.Hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return g.callbackInvoker.Invoke(ctx, calls)
}

// A batch's call runs under its jobs' holds on the gate: with a job
// waiting to run alone ahead of it at the gate, taking the gate again
// would wait behind that job, which waits for the batch's jobs.
func TestBatchCallRunsUnderItsJobsHolds(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, "")
	hs := guard.NewHandles("public", nil)
	var batches []guard.BatchReport
	var bmu sync.Mutex
	runner, err := guard.NewRunner(guard.Config{Handles: hs, BatchMax: 32, OnBatch: func(b guard.BatchReport) {
		bmu.Lock()
		batches = append(batches, b)
		bmu.Unlock()
	}})
	require.NoError(t, err)
	unblock := make(chan struct{})
	inv := &gatedBatchInvoker{gate: pluginhost.NewGate(),
		callbackInvoker: &callbackInvoker{hs: hs, wait: map[string]chan struct{}{"blocker": unblock}, refused: map[string]codes.Code{}}}

	runs := newJobRuns(runner, inv, db)
	runs.timeout = 10 * time.Second
	run := func(id string, alone bool) { runs.startAs(id, usherv1.Guard_GUARD_JOB_ID, alone) }
	var once sync.Once
	inv.before = func(calls []*usherv1.Call) {
		if len(calls) > 1 {
			once.Do(func() {
				run("alone", true)
				time.Sleep(100 * time.Millisecond) // it waits at the gate
			})
		}
	}
	run("blocker", false)
	time.Sleep(50 * time.Millisecond)
	run("a", false)
	run("b", false)
	time.Sleep(50 * time.Millisecond)
	close(unblock)
	outs := runs.wait()
	for _, id := range []string{"blocker", "a", "b", "alone"} {
		require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %s", id, outs[id].Reason)
	}
	require.EqualValues(t, 4, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))
	bmu.Lock()
	defer bmu.Unlock()
	require.Len(t, batches, 1, "a and b in one batch")
	require.True(t, batches[0].Committed, "the batch committed whole, not called off and split")
	require.Equal(t, 2, batches[0].Jobs)
}

package guard_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// gatedInvoker answers applies as countInvoker does, and holds the calls
// of a job listed in wait until wait's channel is closed; it counts the
// calls each job got. The writes of a job listed in lock first take that
// advisory lock.
type gatedInvoker struct {
	mu    sync.Mutex
	calls map[string]int
	wait  map[string]chan struct{}
	lock  map[string]int64
}

func (g *gatedInvoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	for _, c := range calls {
		g.mu.Lock()
		g.calls[c.GetJob().GetId()]++
		ch := g.wait[c.GetJob().GetId()]
		g.mu.Unlock()
		if ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}
	res := make([]*usherv1.Result, len(calls))
	for i := range calls {
		args, err := contract.ToValues([]any{int64(0)})
		if err != nil {
			return nil, err
		}
		res[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{{
			Mode: usherv1.Mode_MODE_EXEC, Sql: `UPDATE gcount SET n = n + 1 WHERE id = $1`, Args: args, MinRows: 1}}}
		if k, ok := g.lock[calls[i].GetJob().GetId()]; ok {
			key, err := contract.ToValues([]any{k})
			if err != nil {
				return nil, err
			}
			lock := &usherv1.Statement{Mode: usherv1.Mode_MODE_EXEC, Sql: `SELECT pg_advisory_xact_lock($1)`, Args: key}
			res[i].Writes = append([]*usherv1.Statement{lock}, res[i].Writes...)
		}
	}
	return res, nil
}

// waitCalled waits until job id's first call is in Invoke.
func (g *gatedInvoker) waitCalled(t *testing.T, id string) {
	t.Helper()
	hosttest.Eventually(t, 10*time.Second, id+" in its Invoke", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.calls[id] == 1
	})
}

// gcountDB is a database whose gcount row 0 gatedInvoker's writes count
// up, and a pool of the raw plugin role (usher_plugin_raw) on it; sql runs
// after the table is made.
func gcountDB(t *testing.T, sql string) (owner *pgxpool.Pool, db guard.DB) {
	t.Helper()
	owner, _ = hosttest.DB(t)
	_, err := owner.Exec(context.Background(), `CREATE TABLE gcount (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
		INSERT INTO gcount (id) VALUES (0); GRANT SELECT, UPDATE ON gcount TO usher_plugin_raw;`+sql)
	require.NoError(t, err)
	return owner, guard.DB{Pool: hosttest.RawPool(t, owner, 4), Role: "usher_plugin_raw"}
}

// A job absorbed at its batch's record finishes once the plugin has
// answered (its batch-mates' writes and commit still to come), and the
// host ends its context when it does (as dispatch does). When it came
// last, its batch-mates must still apply in their batch, once: the batch's
// context is not the absorbed job's. (It was: the batch then lost its
// commit's answer and ran its committed jobs again alone.)
func TestAbsorbedLastJobDoesNotEndItsBatch(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, `INSERT INTO processed_jobs (job_id, kind) VALUES ('absorbed', 'raw_job')`)
	ctx := context.Background()
	runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: 32})
	require.NoError(t, err)

	// The blocker holds the pool's batches in its Invoke while the three
	// others queue, in order, for the next batch; the absorbed one last.
	// Then the batch's writes wait, on an advisory lock the test holds,
	// until the absorbed job's context ended.
	const lockKey = 4471
	held, err := owner.Acquire(ctx)
	require.NoError(t, err)
	_, err = held.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey)
	require.NoError(t, err)
	unblock, absorbedDone, unlocked := make(chan struct{}), make(chan struct{}), make(chan struct{})
	absorbedEnded := sync.OnceFunc(func() { close(absorbedDone) })
	inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{"blocker": unblock}, lock: map[string]int64{"a": lockKey}}
	go func() {
		defer close(unlocked)
		<-absorbedDone
		_, _ = held.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockKey)
	}()
	defer func() {
		absorbedEnded() // the test failed before it: unlock anyway
		<-unlocked
		held.Release()
	}()
	outs := map[string]guard.Outcome{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	run := func(id string, onDone func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jobCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			out := runner.Run(jobCtx, inv, db, usherv1.Guard_GUARD_JOB_ID, &usherv1.Job{Id: id, Kind: "raw_job"}, guard.Delivery{})
			cancel() // as dispatch does when a job returns
			if onDone != nil {
				onDone()
			}
			mu.Lock()
			outs[id] = out
			mu.Unlock()
		}()
	}
	run("blocker", nil)
	inv.waitCalled(t, "blocker")
	for _, id := range []string{"a", "b", "absorbed"} {
		var done func()
		if id == "absorbed" {
			done = absorbedEnded
		}
		run(id, done)
		time.Sleep(50 * time.Millisecond) // queued in this order
	}
	close(unblock)
	wg.Wait()

	require.Equal(t, guard.Absorbed, outs["absorbed"].Verdict, "%+v", outs["absorbed"])
	for _, id := range []string{"blocker", "a", "b"} {
		require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %+v", id, outs[id])
		require.Equal(t, 1, inv.calls[id], fmt.Sprintf("%s was called more than once: its batch split", id))
	}
	require.EqualValues(t, 3, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))
}

// callbackInvoker applies each job by a statement it sends back through
// the host during its call (Handles.Exec, as a plugin's tx.Exec does), not
// by writes returned with its answer; the calls of a job listed in wait
// are held until its channel is closed. refused collects the status codes
// of the statements the host refused.
type callbackInvoker struct {
	hs      *guard.Handles
	mu      sync.Mutex
	wait    map[string]chan struct{}
	refused map[string]codes.Code
}

func (c *callbackInvoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	res := make([]*usherv1.Result, len(calls))
	for i, call := range calls {
		if ch := c.wait[call.GetJob().GetId()]; ch != nil {
			<-ch
		}
		_, err := c.hs.Exec(ctx, &usherv1.ExecRequest{Handle: call.GetHandle(), Statements: []*usherv1.Statement{{
			Mode: usherv1.Mode_MODE_EXEC, Sql: `UPDATE gcount SET n = n + 1 WHERE id = 0`}}})
		res[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK}
		if err != nil {
			c.mu.Lock()
			c.refused[call.GetJob().GetId()] = status.Code(err)
			c.mu.Unlock()
			res[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_ERROR, Error: err.Error()}
		}
	}
	return res, nil
}

// A batch's transaction opens while the plugin applies its jobs: a
// statement the plugin sends back meanwhile waits for it and runs in it,
// and one sent for a job recorded before is refused (that run is
// absorbed), while its batch-mates apply together, once.
func TestBatchCallbacksRunInTheirOpeningTransaction(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, `INSERT INTO processed_jobs (job_id, kind) VALUES ('absorbed', 'raw_job')`)
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
	inv := &callbackInvoker{hs: hs, wait: map[string]chan struct{}{"blocker": unblock}, refused: map[string]codes.Code{}}
	runs := newJobRuns(runner, inv, db)
	// The blocker's batch holds the pool while the others queue for the next.
	runs.start("blocker")
	time.Sleep(50 * time.Millisecond)
	for _, id := range []string{"a", "absorbed", "b"} {
		runs.start(id)
	}
	time.Sleep(50 * time.Millisecond)
	close(unblock)
	outs := runs.wait()

	require.Equal(t, guard.Absorbed, outs["absorbed"].Verdict, "%+v", outs["absorbed"])
	require.Equal(t, codes.Aborted, inv.refused["absorbed"], "the absorbed run's statement is refused")
	for _, id := range []string{"blocker", "a", "b"} {
		require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %+v", id, outs[id])
		require.NotContains(t, inv.refused, id)
	}
	require.EqualValues(t, 3, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))
	require.EqualValues(t, 4, hosttest.Count(t, owner, `SELECT count(*) FROM processed_jobs WHERE kind = 'raw_job'`))
	bmu.Lock()
	defer bmu.Unlock()
	require.Len(t, batches, 1, "a, absorbed and b in one batch")
	require.True(t, batches[0].Committed)
	require.Equal(t, 2, batches[0].Jobs)
}

// jobRuns runs jobs through a runner, each on a goroutine of its
// own as the host's dispatch does, and keeps their outcomes.
type jobRuns struct {
	runner *guard.Runner
	inv    guard.Invoker
	db     guard.DB
	// timeout is each job's deadline. Default 30s.
	timeout time.Duration
	wg      sync.WaitGroup
	mu      sync.Mutex
	outs    map[string]guard.Outcome
}

func newJobRuns(runner *guard.Runner, inv guard.Invoker, db guard.DB) *jobRuns {
	return &jobRuns{runner: runner, inv: inv, db: db, timeout: 30 * time.Second, outs: map[string]guard.Outcome{}}
}

// start runs raw_job job id, whose guard records its id.
func (j *jobRuns) start(id string) { j.startAs(id, usherv1.Guard_GUARD_JOB_ID, false) }

// startAs runs raw_job job id under guard g, as a job that must run alone
// (pluginhost.Alone) when alone is set.
func (j *jobRuns) startAs(id string, g usherv1.Guard, alone bool) {
	j.startJob(&usherv1.Job{Id: id, Kind: "raw_job"}, g, alone)
}

// startJob runs job under guard g, alone when alone is set.
func (j *jobRuns) startJob(job *usherv1.Job, g usherv1.Guard, alone bool) {
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		jobCtx, cancel := context.WithTimeout(context.Background(), j.timeout)
		defer cancel()
		if alone {
			jobCtx = pluginhost.Alone(jobCtx)
		}
		out := j.runner.Run(jobCtx, j.inv, j.db, g, job, guard.Delivery{})
		j.mu.Lock()
		j.outs[job.GetId()] = out
		j.mu.Unlock()
	}()
}

// finished reports whether job id has its outcome.
func (j *jobRuns) finished(id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.outs[id]
	return ok
}

// wait waits for the jobs started so far and returns every outcome.
func (j *jobRuns) wait() map[string]guard.Outcome {
	j.wg.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	return maps.Clone(j.outs)
}

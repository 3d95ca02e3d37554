package guard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/wire"
)

// gatedInvoker answers applies as countInvoker does, and holds the calls
// of a job listed in wait until wait's channel is closed; it counts the
// calls each job got.
type gatedInvoker struct {
	mu    sync.Mutex
	calls map[string]int
	wait  map[string]chan struct{}
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
		args, err := wire.ToValues([]any{int64(0)})
		if err != nil {
			return nil, err
		}
		res[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{{
			Mode: usherv1.Mode_MODE_EXEC, Sql: `UPDATE gcount SET n = n + 1 WHERE id = $1`, Args: args, MinRows: 1}}}
	}
	return res, nil
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

// A job absorbed at its batch's record finishes at once, and the host ends
// its context when it does (as dispatch does). When it came last, its
// batch-mates must still apply in their batch, once: the batch's context
// is not the absorbed job's. (It was: the batch then lost its commit's
// answer and ran its committed jobs again alone.)
func TestAbsorbedLastJobDoesNotEndItsBatch(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, `INSERT INTO processed_jobs (job_id, kind) VALUES ('absorbed', 'raw_job')`)
	ctx := context.Background()
	runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: 32})
	require.NoError(t, err)

	// The blocker holds the pool's batches in its Invoke while the three
	// others queue, in order, for the next batch; the absorbed one last.
	// Then the batch's Invoke waits until the absorbed job's context ended.
	unblock, absorbedDone := make(chan struct{}), make(chan struct{})
	inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{"blocker": unblock, "a": absorbedDone}}
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
	hosttest.Eventually(t, 10*time.Second, "the blocker in its Invoke", func() bool {
		inv.mu.Lock()
		defer inv.mu.Unlock()
		return inv.calls["blocker"] == 1
	})
	for _, id := range []string{"a", "b", "absorbed"} {
		var done func()
		if id == "absorbed" {
			done = func() { close(absorbedDone) }
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

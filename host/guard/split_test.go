package guard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// failingInvoker answers the jobs named in fail with fail's outcome, those
// named in failOn with a permanent failure on that call of theirs (the
// first is 1), and the others as gatedInvoker does.
type failingInvoker struct {
	*gatedInvoker
	fail   map[string]usherv1.Outcome
	failOn map[string]int
}

func (f *failingInvoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	res, err := f.gatedInvoker.Invoke(ctx, calls)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range calls {
		id := c.GetJob().GetId()
		if o, ok := f.fail[id]; ok {
			res[i] = &usherv1.Result{Outcome: o, Error: "this job fails"}
		}
		if n, ok := f.failOn[id]; ok && f.calls[id] == n {
			res[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: fmt.Sprintf("this job fails on call %d", n)}
		}
	}
	return res, nil
}

// A batch split by one job's own failure (its answer, or its write) runs
// that job alone and puts its batch-mates back together: they commit in
// the next batch, one transaction, instead of one transaction each. A job
// is put back once at most: split again, it runs alone.
func TestSplitBatchRunsOnlyTheFailingJobAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// fail answers these jobs so; badWrite's write affects no row.
		fail     map[string]usherv1.Outcome
		failOn   map[string]int
		badWrite bool
		// reports are the batches told (OnBatch); calls each good job's
		// calls.
		reports []string
		calls   int
	}{
		{name: "an answer", fail: map[string]usherv1.Outcome{"bad": usherv1.Outcome_OUTCOME_PERMANENT},
			reports: []string{"split 9", "committed 8"}, calls: 2},
		{name: "a write", badWrite: true, reports: []string{"split 9", "committed 8"}, calls: 2},
		// Job a fails the batch it was put back in (and applies alone,
		// at its third call): the others were put back once already,
		// and run alone too.
		{name: "put back once", fail: map[string]usherv1.Outcome{"bad": usherv1.Outcome_OUTCOME_PERMANENT},
			failOn: map[string]int{"a": 2}, reports: []string{"split 9", "split 8"}, calls: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			owner, db := gcountDB(t, "")
			ctx := context.Background()
			var mu sync.Mutex
			var reports []guard.BatchReport
			runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: 32,
				OnBatch: func(b guard.BatchReport) {
					mu.Lock()
					defer mu.Unlock()
					reports = append(reports, b)
				}})
			require.NoError(t, err)
			unblock := make(chan struct{})
			gated := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{"blocker": unblock}}
			inv := &failingInvoker{gatedInvoker: gated, fail: tc.fail, failOn: tc.failOn}
			var job guard.Invoker = inv
			if tc.badWrite {
				job = &badWriteInvoker{inv: inv, bad: "bad"}
			}
			runs := newJobRuns(runner, job, db)
			runs.start("blocker")
			gated.waitCalled(t, "blocker")
			// Eight jobs and a failing one queue behind it, for one batch.
			good := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
			for _, id := range append(good[:4:4], append([]string{"bad"}, good[4:]...)...) {
				runs.start(id)
			}
			time.Sleep(100 * time.Millisecond)
			close(unblock)
			outs := runs.wait()

			for _, id := range append([]string{"blocker"}, good...) {
				require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %v", id, outs[id])
			}
			require.Equal(t, guard.Permanent, outs["bad"].Verdict, "%v", outs["bad"])
			var n int64
			require.NoError(t, owner.QueryRow(ctx, `SELECT n FROM gcount WHERE id = 0`).Scan(&n))
			require.EqualValues(t, 1+len(good), n, "each good job applied once")
			gated.mu.Lock()
			defer gated.mu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			// The batches told, and each good job's calls: in the first
			// two cases the batch of nine split and its eight good jobs
			// committed together, each called twice (the split batch,
			// then theirs), the failing one alone.
			require.Equal(t, tc.reports, describe(reports))
			for _, id := range good {
				require.Equal(t, tc.calls, gated.calls[id], id)
			}
			require.Equal(t, 2, gated.calls["bad"])
		})
	}
}

func describe(reports []guard.BatchReport) []string {
	var out []string
	for _, r := range reports {
		state := "split"
		if r.Committed {
			state = "committed"
		}
		out = append(out, fmt.Sprintf("%s %d", state, r.Jobs))
	}
	return out
}

// badWriteInvoker answers job bad with a write that needs a row that is
// not there.
type badWriteInvoker struct {
	inv guard.Invoker
	bad string
}

func (b *badWriteInvoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	res, err := b.inv.Invoke(ctx, calls)
	if err != nil {
		return nil, err
	}
	for i, c := range calls {
		if c.GetJob().GetId() == b.bad {
			res[i].Writes = []*usherv1.Statement{{Mode: usherv1.Mode_MODE_EXEC, Sql: `UPDATE gcount SET n = n + 1 WHERE id = -1`, MinRows: 1}}
		}
	}
	return res, nil
}

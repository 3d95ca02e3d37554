package guard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// tooLargeInvoker is gatedInvoker whose answer to a call of more than one
// job, or to any call of a job listed in huge, is gRPC's refusal of a
// message over the cap, as a batch whose jobs' writes add up past it gets.
type tooLargeInvoker struct {
	*gatedInvoker
	huge map[string]bool
}

func (t *tooLargeInvoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	if len(calls) > 1 || t.huge[calls[0].GetJob().GetId()] {
		t.mu.Lock()
		for _, c := range calls {
			t.calls[c.GetJob().GetId()]++
		}
		t.mu.Unlock()
		return nil, status.Error(codes.ResourceExhausted, "grpc: received message larger than max (17000000 vs. 16777216)")
	}
	return t.gatedInvoker.Invoke(ctx, calls)
}

// A batch whose answer is over the gRPC message cap splits: each job runs
// again alone and applies, once. (Abandoned, its jobs met again in the
// same batch after their reclaim, until their deliveries ran out.) A job
// whose own answer is over the cap is dead-lettered at once, saying so.
func TestBatchOverTheMessageCapSplits(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, "")
	runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: 32})
	require.NoError(t, err)
	unblock := make(chan struct{})
	inv := &tooLargeInvoker{
		gatedInvoker: &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{"blocker": unblock}},
		huge:         map[string]bool{"huge": true},
	}
	runs := newJobRuns(runner, inv, db)
	// The blocker holds the pool's batches while the others queue for the
	// next one, which is then refused whole.
	runs.start("blocker")
	inv.waitCalled(t, "blocker")
	for _, id := range []string{"a", "b", "huge"} {
		runs.start(id)
	}
	time.Sleep(100 * time.Millisecond) // queued behind the blocker
	close(unblock)
	outs := runs.wait()

	for _, id := range []string{"blocker", "a", "b"} {
		require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %+v", id, outs[id])
	}
	require.Equal(t, 2, inv.calls["a"], "a: once in the refused batch, once alone")
	require.Equal(t, guard.Permanent, outs["huge"].Verdict, "%+v", outs["huge"])
	require.Contains(t, outs["huge"].Reason, "over the 16777216-byte message cap")
	require.EqualValues(t, 3, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))
	require.Zero(t, hosttest.Count(t, owner, `SELECT count(*) FROM processed_jobs WHERE job_id = 'huge'`), "a dead letter records no apply")
}

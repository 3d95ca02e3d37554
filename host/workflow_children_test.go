package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/hosttest"
)

func (f *flows) stateOf(t *testing.T, typ, id string) (state, errText string) {
	t.Helper()
	var e *string
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT state, error FROM workflows WHERE type = $1 AND workflow_id = $2`, typ, id).Scan(&state, &e))
	if e != nil {
		errText = *e
	}
	return state, errText
}

// A tour starts a trip as its child and waits for it: the child is a
// workflow of its own (its own history and decisions, its parent
// recorded), and its result reaches the parent's history as the step's
// result once it completes, in the transaction that completes it.
func TestChildWorkflowResultReachesItsParent(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()
	_, err := client.StartWorkflow(ctx, f.pool, "tour", "k1", map[string]string{"order": "k1"})
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the child trip reserved and held", func() bool {
		return effects(t, f.pool, "k1", "reserve") == 1 && effects(t, f.pool, "k1", "hold") == 1
	})
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows c JOIN workflows p ON p.id = c.parent
		WHERE c.type = 'trip' AND c.workflow_id = 'tour-k1' AND p.type = 'tour' AND p.workflow_id = 'k1'`))
	_, err = client.SignalWorkflow(ctx, f.pool, "trip", "tour-k1", "pay", "paid", nil)
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the tour completed", func() bool {
		s, _ := f.stateOf(t, "tour", "k1")
		return s == "completed"
	})
	var result string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT result::text FROM workflows WHERE type = 'tour' AND workflow_id = 'k1'`).Scan(&result))
	require.JSONEq(t, `{"trip": {"paid_signals": 1}}`, result)
	requireTripOnce(t, f, "k1")
	f.requireDecidedOnce(t, "k1")
	f.requireDecidedOnce(t, "tour-k1")
}

// Cancelling a parent cancels its children: the tour's cancel is asked of
// its trip, which releases what it reserved (its compensation, once) and
// ends cancelled; the tour's step fails with why, and the tour ends
// cancelled.
func TestCancellingAParentCancelsItsChildren(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()
	_, err := client.StartWorkflow(ctx, f.pool, "tour", "k2", map[string]string{"order": "k2"})
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the child trip reserved", func() bool {
		return effects(t, f.pool, "k2", "reserve") == 1
	})
	_, err = client.CancelWorkflow(ctx, f.pool, "tour", "k2", "buyer left")
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the tour and its trip cancelled", func() bool {
		p, _ := f.stateOf(t, "tour", "k2")
		c, _ := f.stateOf(t, "trip", "tour-k2")
		return p == "cancelled" && c == "cancelled"
	})
	require.EqualValues(t, 1, effects(t, f.pool, "k2", "release"), "the child's compensation ran once")
	require.Zero(t, effects(t, f.pool, "k2", "notify"))
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_events e JOIN workflows w ON w.id = e.workflow
		WHERE w.workflow_id = 'tour-k2' AND e.type = 'cancel_requested' AND e.detail = 'its parent was asked to cancel: buyer left'`))
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_events e JOIN workflows w ON w.id = e.workflow
		WHERE w.workflow_id = 'k2' AND e.type = 'step_failed' AND e.name = 'trip' AND e.detail LIKE 'trip workflow tour-k2 cancelled%'`))
}

// A child the plugin may not start (a type it neither serves nor lists in
// its enqueues), or one whose id exists, is refused: the decision's task
// is dead-lettered and the parent fails with the rule, and nothing of the
// child is started.
func TestChildWorkflowRefusals(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()
	_, err := client.StartWorkflow(ctx, f.pool, "trip", "taken", map[string]string{"order": "taken"})
	require.NoError(t, err)
	for id, input := range map[string]map[string]string{
		"foreign": {"order": "foreign", "child_type": "raw"},
		"clash":   {"order": "clash", "child_id": "taken"},
	} {
		_, err := client.StartWorkflow(ctx, f.pool, "tour", id, input)
		require.NoError(t, err)
	}
	for id, msg := range map[string]string{
		"foreign": "may not enqueue kinds [usher.workflow.raw]",
		"clash":   "workflows [trip taken] exist: a child is a new workflow",
	} {
		hosttest.Eventually(t, 60*time.Second, "tour "+id+" failed", func() bool {
			s, _ := f.stateOf(t, "tour", id)
			return s == "failed"
		})
		_, e := f.stateOf(t, "tour", id)
		require.Contains(t, e, msg, id)
	}
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE parent IS NOT NULL`))
}

package host_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// verdicts counts a job's records by verdict.
func verdicts(j *history.Job) map[outcome.Outcome]int {
	n := map[outcome.Outcome]int{}
	for _, r := range j.History {
		n[r.Verdict]++
	}
	return n
}

// A known flow with faults: order A's counter job fails once and is
// published twice, its render crashes the plugin after its conditional
// write won (the transaction rolls back), and order B's counter job fails
// permanently. The history shows every delivery with its verdict, the
// rolled-back run leaves no applied record, and the workflow links the
// render to the send it enqueued.
func TestJobHistoryOfAFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	mailURL := hosttest.MailProvider(t)
	tickets := hosttest.Build(t, "./plugins/tickets/chaos")
	ev, err := orders.CreateEvent(ctx, b.pool, "Nils Frahm", "Funkhaus")
	require.NoError(t, err)
	// Of priority 1: the send its render enqueues takes it.
	a, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Zoë", Email: "zoe@example.com", Seats: 2},
		orders.Jobs{Counter: true, Tickets: true, Priority: 1})
	require.NoError(t, err)
	counterA, renderA := fmt.Sprint(a.OutboxIDs[0]), fmt.Sprint(a.OutboxIDs[1])
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "error", Once: true, JobIDs: []string{counterA}}))
	require.NoError(t, faults.Arm(b.faultDir, "render.after_commit", faults.Spec{Action: "crash", Once: true, JobIDs: []string{renderA}}))

	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, tickets)
	cfg.PluginEnv = append(cfg.PluginEnv, "USHER_BLOB_DIR="+t.TempDir(), "MAILPROVIDER_URL="+mailURL, "TICKETS_CLAIM_LEASE=1m")
	cfg.RetryBackoff = 100 * time.Millisecond
	var once sync.Once
	cfg.RelayAfterPublish = func(ids []int64) error { // the first batch is published twice
		var err error
		once.Do(func() { err = fmt.Errorf("relay crashed between publish and mark") })
		return err
	}
	hosttest.Start(t, cfg)

	hosttest.Eventually(t, 60*time.Second, "order A's jobs done", func() bool {
		w, err := history.GetWorkflow(ctx, b.pool, a.RequestID)
		return err == nil && w.Count == 3 && w.States[history.Done] == 3 && hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	w, err := history.GetWorkflow(ctx, b.pool, a.RequestID)
	require.NoError(t, err)
	require.Len(t, w.Jobs, 2, "the order's two jobs at the root")
	require.Equal(t, counterA, w.Jobs[0].ID)
	render := w.Jobs[1]
	require.Equal(t, renderA, render.ID)
	require.Len(t, render.Children, 1, "render enqueued the send")
	send := render.Children[0]
	require.Equal(t, "send_tickets", send.Kind)
	require.Equal(t, renderA, send.Parent)
	require.Equal(t, []int{1, 1, 1}, []int{w.Jobs[0].Priority, render.Priority, send.Priority}, "the order's priority, and the send's from its parent")

	// The counter: one run failed (retry), one applied, and the other
	// delivery (the relay's duplicate or the retry) was absorbed.
	counter := w.Jobs[0]
	require.Equal(t, map[outcome.Outcome]int{history.Retry: 1, history.Applied: 1, history.Absorbed: 1}, verdicts(counter), "%+v", counter.History)
	require.Equal(t, 1, counter.Absorbed)
	for _, r := range counter.History {
		require.Equal(t, "counters", r.Plugin)
		require.NotEmpty(t, r.PluginVersion)
		require.Equal(t, "job_id", r.Guard)
		require.NotEmpty(t, r.Consumer)
		require.NotEmpty(t, r.StreamID)
		require.GreaterOrEqual(t, r.Deliveries, 1)
		require.False(t, r.FinishedAt.Before(r.StartedAt))
		switch r.Verdict {
		case history.Retry:
			require.Contains(t, r.Error, "injected transient error")
			require.Contains(t, r.Reason, "runs again in")
		case history.Absorbed:
			require.Equal(t, "job id already recorded", r.Reason)
		}
	}
	// The render: its crashed run was rolled back, so it has one applied
	// record, and at least one abandoned one for the crash.
	v := verdicts(render)
	require.Equal(t, 1, v[history.Applied], "%+v", render.History)
	require.GreaterOrEqual(t, v[history.Abandoned], 1, "%+v", render.History)
	require.Equal(t, "state_first", render.History[0].Guard)
	require.Equal(t, 1, verdicts(send)[history.Applied], "%+v", send.History)
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict = 'applied' AND job_id = $1`, renderA))
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = 'send_tickets'`))

	// Order B's counter job fails for good: dead-lettered. The fault is
	// armed before the order commits, or the job may apply first.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	bo, err := orders.PlaceTx(ctx, tx, orders.Order{EventID: ev, Buyer: "Ada", Email: "ada@example.com", Seats: 1}, orders.Jobs{Counter: true})
	require.NoError(t, err)
	counterB := fmt.Sprint(bo.OutboxIDs[0])
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "permanent", JobIDs: []string{counterB}}))
	require.NoError(t, tx.Commit(ctx))
	hosttest.Eventually(t, 30*time.Second, "order B's counter job dead-lettered", func() bool {
		j, err := history.GetJob(ctx, b.pool, counterB)
		return err == nil && j.State == history.DeadLetteredState
	})
	j, err := history.GetJob(ctx, b.pool, counterB)
	require.NoError(t, err)
	require.Equal(t, bo.RequestID, j.RequestID)
	require.NotZero(t, j.DeadLetter)
	require.True(t, slices.ContainsFunc(j.History, func(r history.Record) bool {
		return r.Verdict == history.DeadLettered && r.Error != "" && r.Guard == "job_id"
	}), "%+v", j.History)
	require.Contains(t, j.History[len(j.History)-1].Reason, "permanent: ")
}

package main_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// A duplicate of send_tickets that finds the claim held by the run still
// sending (stalled 3s in its effect) retries when that run marks the
// claim done, not after the claim's one-minute lease: the owner's mark
// wakes the waiting retry, which finds the effect done and is absorbed.
// One email leaves.
func TestClaimDoneWakesTheWaitingDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease = time.Minute
	p := b.order(t, orders.Jobs{Tickets: true})
	require.NoError(t, faults.Arm(b.faultDir, "send.before_effect", faults.Spec{Action: "stall", Duration: "3s", Once: true}))
	cfg := b.config(lease)
	var once sync.Once
	cfg.RelayAfterPublish = func(ids []int64) error { // publish the send_tickets row twice
		fired := false
		if slices.ContainsFunc(ids, func(id int64) bool { return !slices.Contains(p.OutboxIDs, id) }) {
			once.Do(func() { fired = true })
		}
		if fired {
			return errors.New("relay crashed between publish and mark")
		}
		return nil
	}
	hosttest.Start(t, cfg)

	ctx := context.Background()
	var sendJob string
	hosttest.Eventually(t, 45*time.Second, "the duplicate's retry run, absorbed, and nothing pending", func() bool {
		if sendJob == "" {
			if err := b.pool.QueryRow(ctx, `SELECT id::text FROM outbox WHERE kind = 'send_tickets'`).Scan(&sendJob); err != nil {
				return false
			}
		}
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict = 'absorbed' AND attempt = 1`, sendJob) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	var waited, afterMark time.Duration
	require.NoError(t, b.pool.QueryRow(ctx, `
		SELECT s.enqueued_at - s.created_at,
		       (SELECT finished_at FROM job_history WHERE job_id = $1 AND verdict = 'absorbed' AND attempt = 1)
		     - (SELECT finished_at FROM job_history WHERE job_id = $1 AND verdict = 'applied')
		FROM scheduled_jobs s WHERE s.job_id = $1 AND s.reason = 'claim held by another run'`, sendJob).Scan(&waited, &afterMark))
	t.Logf("the duplicate's retry waited %s (lease %s); it ended %s after the owner's mark", waited.Round(time.Millisecond), lease, afterMark.Round(time.Millisecond))
	require.Less(t, waited, lease, "the retry ran before the claim's lease ran out")
	require.EqualValues(t, 1, b.absorbed(t, "effect already done"))
	require.Len(t, b.messages(t), 1, "one email at the provider")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_tickets.email_sends WHERE order_id = $1 AND sent_at IS NOT NULL`, p.ID))
}

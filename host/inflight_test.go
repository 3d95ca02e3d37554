package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// A job its plugin holds is counted in flight on its plugin, and its entry
// is the oldest pending one, aging, until it finishes; then neither.
func TestInFlightAndPendingAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.placeOrders(t, 1, 1)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "3s", Once: true})
	cfg := b.config()
	cfg.ReclaimIdle = time.Hour
	h := hosttest.Start(t, cfg)
	b.held(t, "counter.before_apply", jobID)

	require.EqualValues(t, 1, h.Plugins()[0].InFlight)
	ctx := context.Background()
	hosttest.Eventually(t, 5*time.Second, "the held entry to age", func() bool {
		lag, err := ops.ReadLag(ctx, b.pool, b.rdb, b.stream, "usher", time.Now())
		require.NoError(t, err)
		return lag.OldestPending >= 500*time.Millisecond && lag.GroupLag == 0
	})
	b.waitDrained(t, 1)
	hosttest.Eventually(t, 5*time.Second, "nothing in flight", func() bool { return h.Plugins()[0].InFlight == 0 })
	lag, err := ops.ReadLag(ctx, b.pool, b.rdb, b.stream, "usher", time.Now())
	require.NoError(t, err)
	require.Zero(t, lag.OldestPending)
}

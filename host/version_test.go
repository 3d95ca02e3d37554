package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// A batch called off as stalled runs its jobs again alone; when a swap
// came in between, they run on the new version, and their history must
// name it: every applied record names the version whose own row (the
// chaos counters' counter_applies, written in the same transaction) says
// it ran the job (issue 26, item 10).
func TestHistoryNamesTheVersionThatRan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	next := hosttest.Build(t, "./plugins/counters/chaos", "main.version=1.1.0")
	want := b.placeOrders(t, 12, 2)
	stalled := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "60s", Once: true})
	cfg := b.config()
	cfg.BatchMax = 32
	// The swap below must route new calls before the batch is called off;
	// under -race on a loaded 2-core CI machine a swap (start, handshake,
	// health) took more than 2 s, so the margin is wide.
	cfg.StalledAfter = 12 * time.Second
	cfg.RollbackWindow = -1
	h := hosttest.Start(t, cfg)
	b.held(t, "counter.before_apply", stalled)
	// The batch holding the stalled job is called off at StalledAfter,
	// after the swap routed new calls to 1.1.0: its jobs run again there.
	swapStart := time.Now()
	res, err := h.Host.Swap(context.Background(), "counters", next)
	require.NoError(t, err)
	require.Equal(t, "1.1.0", res.To.Version)
	t.Logf("swap took %s", time.Since(swapStart))
	hosttest.Eventually(t, 90*time.Second, "every counter job applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 12
	})
	b.requireCounters(t, want)
	require.NotZero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '1.1.0'`),
		"some jobs ran on the version swapped in")
	require.Zero(t, hosttest.Count(t, b.pool, `
		SELECT count(*) FROM counter_applies a JOIN job_history h ON h.job_id = a.job_id AND h.verdict = 'applied'
		WHERE h.plugin_version <> a.plugin_version`), "an applied record names another version than the one that ran the job")
}

package host_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// Shutdown stops reading, waits for in-flight jobs up to the grace period,
// then abandons the rest unacked: the next host reclaims and applies them
// once.
func TestShutdownAbandonsInFlightUnacked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 3, 1)
	// Not Once: a batch holding the hanging job is called off after
	// StalledAfter and its jobs run again alone, where this one must hang
	// again; it is disarmed before the second host starts.
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h"})
	cfg := b.config()
	cfg.ShutdownGrace = 300 * time.Millisecond
	first := hosttest.Start(t, cfg)
	b.held(t, "counter.before_apply", jobID)
	hosttest.Eventually(t, 20*time.Second, "the others applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 2
	})
	require.NoError(t, first.Stop())
	require.EqualValues(t, 1, hosttest.Pending(t, b.rdb, b.stream, "usher"), "the abandoned entry stays pending")
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`), "its transaction rolled back")

	require.NoError(t, faults.Disarm(b.faultDir, "counter.before_apply"))
	second := b.config()
	second.DisableRelay = true
	hosttest.Start(t, second)
	b.waitDrained(t, 3)
	b.requireCounters(t, want)
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
}

package host_test

import (
	"context"
	"os"
	"path/filepath"
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
	var jobID string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT id::text FROM outbox ORDER BY id LIMIT 1`).Scan(&jobID))
	require.NoError(t, faults.Arm(b.faultDir, "counter.apply", faults.Spec{Action: "stall", Duration: "1h", JobIDs: []string{jobID}, Once: true}))
	cfg := b.config()
	cfg.ShutdownGrace = 300 * time.Millisecond
	first := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 20*time.Second, "the stalled job held and the others applied", func() bool {
		_, err := os.Stat(filepath.Join(b.faultDir, "counter.apply."+jobID+".hit"))
		return err == nil && hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 2
	})
	require.NoError(t, first.Stop())
	require.EqualValues(t, 1, hosttest.Pending(t, b.rdb, b.stream, "usher"), "the abandoned entry stays pending")
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`), "its transaction rolled back")

	second := b.config()
	second.DisableRelay = true
	hosttest.Start(t, second)
	b.waitDrained(t, 3)
	b.requireCounters(t, want)
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
}

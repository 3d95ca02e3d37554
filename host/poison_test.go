package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// One entry among 40 crashes the counters plugin's process every time it
// runs. It is dead-lettered as poison after PoisonCrashes crashes; the crash
// loop it caused marks the plugin unhealthy, which ends by itself once the
// poison is gone; every other job is applied once. No operator acts.
func TestPoisonEntryDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 40, 4)
	poisonID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "crash"})
	cfg := b.config()
	cfg.PoisonCrashes = 3
	cfg.PluginCrashLoop = 2 // the poison's crashes make a crash loop
	cfg.PluginUnhealthyRetry = 500 * time.Millisecond
	cfg.Concurrency = 8
	h := hosttest.Start(t, cfg)
	t.Cleanup(func() {
		keys, _ := b.rdb.Keys(context.Background(), b.stream+":crashes:*").Result()
		for _, k := range keys {
			_ = b.rdb.Del(context.Background(), k).Err()
		}
	})

	hosttest.Eventually(t, 60*time.Second, "the poison dead-lettered, the 39 others applied, nothing pending", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 1 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 39 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	letters, err := deadletter.List(context.Background(), b.pool, "", 10)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, poisonID, letters[0].JobID)
	require.Contains(t, letters[0].Reason, "poison: its runs crashed the plugin's process 3 times (max 3")
	require.Contains(t, letters[0].Reason, "with no other call in flight", "the last crash was the poison's alone")
	require.EqualValues(t, 39, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`), "each applied once")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, poisonID))
	// The poison's seats are missing from its event's counter.
	var poisonEvent, poisonSeats int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT o.event_id, o.seats FROM outbox x JOIN orders o ON o.id = (x.payload->>'order_id')::bigint WHERE x.id::text = $1`, poisonID).
		Scan(&poisonEvent, &poisonSeats))
	want[poisonEvent] -= poisonSeats
	b.requireCounters(t, want)

	// The supervisor may not have seen the last crash yet when the dead
	// letter is written: wait for the restart it brings, not just health.
	hosttest.Eventually(t, 30*time.Second, "the plugin restarted after each of the poison's 3 crashes, healthy and running again", func() bool {
		p := h.Plugins()[0]
		return p.Restarts >= 3 && p.Healthy && p.Pid != 0
	})
	keys, err := b.rdb.Keys(context.Background(), b.stream+":crashes:*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "no crash count left behind")
}

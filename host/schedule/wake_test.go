package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/schedule"
)

// A wake moves the runs waiting for its claim to now, and only those; a
// run added after a wake it should have seen (its run found the claim
// held before the wake) is due at once; one whose run started after the
// wake keeps its time.
func TestWakeClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := hosttest.DB(t)
	later := time.Now().Add(time.Hour)
	add := func(job, key string, since time.Time) {
		t.Helper()
		added, err := schedule.Add(ctx, pool, schedule.Run{JobID: job, Kind: "send_tickets", Payload: []byte(`{}`), RunAt: later,
			Reason: "claim held by another run", WaitsFor: key, WaitsSince: since})
		require.NoError(t, err)
		require.True(t, added)
	}
	due := func(job string) bool {
		t.Helper()
		return hosttest.Count(t, pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND run_at <= now()`, job) == 1
	}
	add("a", "email_sends[order_id]=[1]", time.Now())
	add("b", "email_sends[order_id]=[2]", time.Now())
	add("c", "", time.Time{})
	n, err := schedule.WakeClaim(ctx, pool, "email_sends[order_id]=[1]")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.True(t, due("a"))
	require.False(t, due("b"), "another claim's")
	require.False(t, due("c"), "waits for no claim")

	before := time.Now().Add(-time.Second)
	n, err = schedule.WakeClaim(ctx, pool, "email_sends[order_id]=[3]")
	require.NoError(t, err)
	require.Zero(t, n, "none waiting yet")
	add("d", "email_sends[order_id]=[3]", before)
	require.True(t, due("d"), "added after the wake it missed: due at once")
	add("e", "email_sends[order_id]=[3]", time.Now().Add(time.Second))
	require.False(t, due("e"), "its run started after the wake: the claim is held again")
}

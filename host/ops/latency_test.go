package ops_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
)

// Queue wait (a job's commit to its first delivery's start) is read from
// the history, which carries the commit time (committed_at, filled in by
// the record's insert from its outbox row): its percentiles are the same
// after retention deleted the outbox rows. Run time's are too. A retry's
// or a reclaimed delivery's record waits for nothing and is not counted.
func TestQueueWaitOutlivesOutboxRetention(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	committed := time.Now().Add(-30 * time.Minute).UTC().Truncate(time.Millisecond)
	// 100 jobs committed together, the i-th first started i seconds later.
	for i := 1; i <= 100; i++ {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (kind, payload, created_at, published_at, done_at, outcome)
			VALUES ('waiting_job', '{}', $1, now(), now(), 'applied') RETURNING id`, committed).Scan(&id))
		r := history.Record{JobID: "w" + strconv.Itoa(i), Kind: "waiting_job", OutboxID: id, Verdict: history.Applied,
			Deliveries: 1, StartedAt: committed.Add(time.Duration(i) * time.Second)}
		require.NoError(t, history.Write(ctx, pool, r))
		if i%10 == 0 {
			r.Attempt, r.StartedAt = 1, committed.Add(time.Hour) // a retry: no wait
			require.NoError(t, history.Write(ctx, pool, r))
			r.Attempt, r.Deliveries = 0, 2 // a reclaim: no wait
			require.NoError(t, history.Write(ctx, pool, r))
		}
	}
	require.EqualValues(t, 120, hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE committed_at = $1`, committed),
		"every record carries its job's commit time")

	read := func() ops.Latency {
		t.Helper()
		lats, err := ops.Latencies(ctx, pool, time.Now().Add(-time.Hour), time.Now().Add(time.Minute))
		require.NoError(t, err)
		require.Len(t, lats, 1)
		return lats[0]
	}
	before := read()
	require.EqualValues(t, 100, before.Waits)
	// percentile_cont over 1..100 s.
	for i, want := range []time.Duration{50500 * time.Millisecond, 95050 * time.Millisecond, 99010 * time.Millisecond} {
		require.InDelta(t, want, before.Wait[i], float64(time.Millisecond), "p%d", []int{50, 95, 99}[i])
	}

	_, err := pool.Exec(ctx, `DELETE FROM outbox`)
	require.NoError(t, err)
	require.Equal(t, before, read(), "the same once the outbox rows are gone")
}

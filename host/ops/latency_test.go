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
	"github.com/usherhq/usher/host/retention"
)

// Queue wait (a job's commit to its first delivery's start) reads the
// commit time from the job's outbox row, and once retention deleted the
// row from the history record, which the delete stamps (committed_at;
// nothing on a job's path writes it): its percentiles are the same after
// retention. Run time's are too. A retry's
// or a reclaimed delivery's record waits for nothing and is not counted.
func TestQueueWaitOutlivesOutboxRetention(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	committed := time.Now().Add(-30 * time.Minute).UTC().Truncate(time.Millisecond)
	// 100 jobs committed together, the i-th first started i seconds later.
	for i := 1; i <= 100; i++ {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (job_id, kind, payload, created_at, published_at, done_at, outcome)
			VALUES ($2, 'waiting_job', '{}', $1, $1, $1, 'applied') RETURNING id`, committed, "w"+strconv.Itoa(i)).Scan(&id))
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
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE committed_at IS NOT NULL`),
		"a record is written without its commit time")

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

	rdb, stream := hosttest.Redis(t)
	r, err := retention.New(retention.Config{Redis: rdb, Pool: pool, Streams: []string{stream}, Group: "usher", Self: "self",
		Logger: hosttest.Logger(t, -4), Redelivery: retention.Redelivery{ReconcileAfter: time.Minute}, Outbox: time.Minute, Margin: time.Minute})
	require.NoError(t, err)
	_, err = r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`), "retention deleted the rows")
	require.EqualValues(t, 120, hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE committed_at = $1`, committed),
		"retention's delete stamped each record with its job's commit time")
	require.Equal(t, before, read(), "the same once the outbox rows are gone")
}

package ops_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outbox"
)

// Throughput counts the job history's records by bucket, kind, verdict and
// guard, with their run time, inside its window only: the numbers are the
// table's.
func TestThroughputCountsTheHistory(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	// Records finished at t0+offset after running for took.
	for _, r := range []struct {
		kind, verdict, guard string
		offset, took         time.Duration
	}{
		{"update_sales_counter", "applied", "job id recorded", 5 * time.Second, 100 * time.Millisecond},
		{"update_sales_counter", "applied", "job id recorded", 59 * time.Second, 300 * time.Millisecond},
		{"update_sales_counter", "absorbed", "job id recorded", 61 * time.Second, 10 * time.Millisecond},
		{"render_tickets", "retry_scheduled", "state first", 62 * time.Second, time.Second},
		{"render_tickets", "applied", "state first", 3 * time.Minute, time.Second}, // outside the window
		{"render_tickets", "applied", "state first", -time.Second, time.Second},    // before it
	} {
		fin := t0.Add(r.offset)
		_, err := pool.Exec(ctx, `INSERT INTO job_history (job_id, kind, verdict, guard, started_at, finished_at)
			VALUES ('1', $1, $2, $3, $4, $5)`, r.kind, r.verdict, r.guard, fin.Add(-r.took), fin)
		require.NoError(t, err)
	}
	got, err := ops.Throughput(ctx, pool, t0, t0.Add(2*time.Minute), time.Minute)
	require.NoError(t, err)
	require.Equal(t, []ops.Bucket{
		{Start: t0, Kind: "update_sales_counter", Verdict: "applied", Guard: "job id recorded", Count: 2, TookMS: 400},
		{Start: t0.Add(time.Minute), Kind: "render_tickets", Verdict: "retry_scheduled", Guard: "state first", Count: 1, TookMS: 1000},
		{Start: t0.Add(time.Minute), Kind: "update_sales_counter", Verdict: "absorbed", Guard: "job id recorded", Count: 1, TookMS: 10},
	}, got)
	require.Equal(t, t0.Add(time.Minute), ops.BucketStart(t0.Add(61*time.Second), time.Minute))

	// The index can answer the chart's query alone (with a table this
	// small the planner would scan it, so sequential scans are off).
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN "+ops.ThroughputSQL, t0, t0.Add(time.Hour), 60.0)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "Index Only Scan using job_history_chart")
}

// A reclaimed delivery (delivered more than once) is counted in its
// bucket; a republish the reconciler made is recorded (job_republishes)
// and counted by Republishes even once retention deleted its outbox row.
func TestReclaimsAndRepublishesCounted(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	for _, d := range []int{1, 2, 3} {
		_, err := pool.Exec(ctx, `INSERT INTO job_history (job_id, kind, verdict, guard, deliveries, started_at, finished_at)
			VALUES ('1', 'update_sales_counter', 'applied', 'g', $1, $2, $2)`, d, t0.Add(time.Second))
		require.NoError(t, err)
	}
	got, err := ops.Throughput(ctx, pool, t0, t0.Add(time.Minute), time.Minute)
	require.NoError(t, err)
	require.Equal(t, []ops.Bucket{{Start: t0, Kind: "update_sales_counter", Verdict: "applied", Guard: "g", Count: 3, Reclaimed: 2}}, got)

	// A row published long ago with no outcome: its entry was lost.
	ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: []byte(`{"order_id": 1}`)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox SET published_at = now() - interval '1 hour' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	rec, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: pool, Redis: rdb, Streams: []string{stream}, Group: "usher", StaleAfter: time.Minute})
	require.NoError(t, err)
	n, err := rec.Reconcile(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM job_republishes WHERE outbox_id = $1 AND job_id = $2`,
		ids[0], strconv.FormatInt(ids[0], 10)))
	_, err = pool.Exec(ctx, `DELETE FROM outbox`) // retention
	require.NoError(t, err)
	var at time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT republished_at FROM job_republishes`).Scan(&at))
	now := time.Now()
	rep, err := ops.Republishes(ctx, pool, now.Add(-2*time.Hour), now.Add(time.Minute), time.Hour)
	require.NoError(t, err)
	require.Equal(t, []ops.Republished{{Start: ops.BucketStart(at, time.Hour), Kind: "update_sales_counter", Count: 1}}, rep)
	// Trimmed with the history's window.
	deleted, err := history.TrimRepublishes(ctx, pool, now.Add(time.Minute), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, deleted)
}

// percentile is percentile_cont's: p of sorted, linearly between the two
// nearest ranks.
func percentile(sorted []time.Duration, p float64) time.Duration {
	pos := p * float64(len(sorted)-1)
	lo := int(pos)
	if lo+1 >= len(sorted) {
		return sorted[lo]
	}
	return sorted[lo] + time.Duration(float64(sorted[lo+1]-sorted[lo])*(pos-float64(lo)))
}

// Latencies gives each kind's p50, p95 and p99 of run time over every
// delivery in the window, and of queue wait (outbox commit to start) over
// its first deliveries whose outbox row is kept: a retry's and an
// orphan's run times count, their waits do not, and a delivery outside
// the window counts in neither. Only the newest LatencySample deliveries
// are read.
func TestLatenciesArePercentiles(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	record := func(kind string, outboxID *int64, attempt, deliveries int, start time.Time, took time.Duration) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO job_history (job_id, kind, outbox_id, attempt, deliveries, verdict, started_at, finished_at)
			VALUES ('1', $1, $2, $3, $4, 'applied', $5, $6)`, kind, outboxID, attempt, deliveries, start, start.Add(took))
		require.NoError(t, err)
	}
	var runs, waits []time.Duration
	for i := 1; i <= 20; i++ {
		// Committed at t0+i s, started i*7 ms later (not in the runs'
		// order), ran i ms.
		committed := t0.Add(time.Duration(i) * time.Second)
		wait, took := time.Duration((i*7)%20+1)*time.Millisecond, time.Duration(i)*time.Millisecond
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (kind, payload, created_at) VALUES ('a', '{}', $1) RETURNING id`, committed).Scan(&id))
		record("a", &id, 0, 1, committed.Add(wait), took)
		runs, waits = append(runs, took), append(waits, wait)
	}
	// A retry of the first job (a wait of its own would be the backoff's)
	// and a first delivery whose outbox row retention deleted.
	first := hosttest.Count(t, pool, `SELECT min(id) FROM outbox`)
	record("a", &first, 1, 1, t0.Add(30*time.Second), time.Second)
	gone := int64(1 << 40)
	record("a", &gone, 0, 1, t0.Add(31*time.Second), 500*time.Millisecond)
	runs = append(runs, time.Second, 500*time.Millisecond)
	record("a", nil, 0, 1, t0.Add(time.Hour), time.Hour) // outside the window
	record("b", nil, 0, 2, t0.Add(40*time.Second), 2*time.Millisecond)

	got, err := ops.Latencies(ctx, pool, t0, t0.Add(time.Minute))
	require.NoError(t, err)
	require.Len(t, got, 2)
	slices.Sort(runs)
	slices.Sort(waits)
	a := got[0]
	require.Equal(t, "a", a.Kind)
	require.EqualValues(t, 22, a.Deliveries)
	require.EqualValues(t, 20, a.Waits)
	for i, p := range []float64{0.5, 0.95, 0.99} {
		require.InDelta(t, percentile(runs, p), a.Run[i], float64(time.Microsecond), "run p%v", p*100)
		require.InDelta(t, percentile(waits, p), a.Wait[i], float64(time.Microsecond), "wait p%v", p*100)
	}
	// One delivery, reclaimed (not a first delivery): no wait.
	require.Equal(t, ops.Latency{Kind: "b", Deliveries: 1, Run: [3]time.Duration{2 * time.Millisecond, 2 * time.Millisecond, 2 * time.Millisecond}}, got[1])

	// The newest LatencySample deliveries only: that many of c, newer
	// than every a, leave a out.
	_, err = pool.Exec(ctx, `INSERT INTO job_history (job_id, kind, verdict, started_at, finished_at)
		SELECT '1', 'c', 'applied', $1::timestamptz + i * interval '1 ms', $1::timestamptz + i * interval '1 ms' + interval '3 ms'
		FROM generate_series(1, $2) i`, t0.Add(50*time.Second), ops.LatencySample)
	require.NoError(t, err)
	got, err = ops.Latencies(ctx, pool, t0, t0.Add(time.Minute))
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "c", got[0].Kind)
	require.EqualValues(t, ops.LatencySample, got[0].Deliveries)
	require.InDelta(t, 3*time.Millisecond, got[0].Run[1], float64(time.Microsecond))
}

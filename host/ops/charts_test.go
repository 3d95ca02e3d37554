package ops_test

import (
	"context"
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

package ops_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
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

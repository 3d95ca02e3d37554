package recurring_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/recurring"
)

// Three tickers (three hosts) scan one schedule at once, each many times
// per tick: every tick starts its workflow once, named NAME@TICK.
func TestEachTickFiresOnceAcrossHosts(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := start
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	_, err := recurring.Add(ctx, pool, recurring.Schedule{Name: "nightly", Target: recurring.Workflow, What: "trip",
		Input: []byte(`{"order": "n"}`), Every: time.Minute, CatchUp: recurring.CatchUpAll}, start)
	require.NoError(t, err)
	var tickers []*recurring.Ticker
	for range 3 {
		tk, err := recurring.NewTicker(recurring.TickerConfig{Pool: pool, Now: now})
		require.NoError(t, err)
		tickers = append(tickers, tk)
	}
	for range 30 { // 30 minutes, each scanned 3 × 4 times at once
		mu.Lock()
		clock = clock.Add(time.Minute)
		mu.Unlock()
		var wg sync.WaitGroup
		for _, tk := range tickers {
			for range 4 {
				wg.Go(func() {
					_, err := tk.Fire(ctx)
					require.NoError(t, err)
				})
			}
		}
		wg.Wait()
	}
	rows, err := pool.Query(ctx, `SELECT workflow_id FROM workflows WHERE type = 'trip' ORDER BY workflow_id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 30)
	require.Equal(t, "nightly@2026-01-01T00:01:00Z", ids[0])
	require.Equal(t, "nightly@2026-01-01T00:30:00Z", ids[29])
	list, err := recurring.List(ctx, pool)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.EqualValues(t, 30, list[0].Fired)
	require.Equal(t, start.Add(31*time.Minute), list[0].NextAt.UTC())
}

// Schedules whose hosts were down for 11½ minutes fire what their catch-up
// policy says: all eleven missed ticks, the latest, or none (the latest is
// more than a minute late); jobs are enqueued with the tick's
// deduplication key.
func TestCatchUpAfterDowntime(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{recurring.CatchUpAll, recurring.CatchUpOne, recurring.CatchUpSkip} {
		every := time.Minute
		if p == recurring.CatchUpSkip {
			every = 5 * time.Minute
		}
		_, err := recurring.Add(ctx, pool, recurring.Schedule{Name: "every-" + p, Target: recurring.Job, What: "report_" + p,
			Input: []byte(`{}`), Every: every, CatchUp: p}, start)
		require.NoError(t, err)
	}
	_, err := recurring.Add(ctx, pool, recurring.Schedule{Name: "cron-one", Target: recurring.Job, What: "report_cron",
		Cron: "*/5 * * * *"}, start)
	require.NoError(t, err)
	tk, err := recurring.NewTicker(recurring.TickerConfig{Pool: pool, Now: func() time.Time { return start.Add(10*time.Minute + 90*time.Second) }})
	require.NoError(t, err)
	n, err := tk.Fire(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	count := func(kind string) int64 {
		return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE kind = $1`, kind)
	}
	require.EqualValues(t, 11, count("report_all"))
	require.EqualValues(t, 1, count("report_one"))
	require.EqualValues(t, 0, count("report_skip"), "the latest tick is 90 s late")
	require.EqualValues(t, 1, count("report_cron"))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM job_dedup_keys WHERE dedup_key = 'every-one@2026-01-01T00:11:00Z'`))
	list, err := recurring.List(ctx, pool)
	require.NoError(t, err)
	byName := map[string]recurring.Schedule{}
	for _, s := range list {
		byName[s.Name] = s
	}
	require.EqualValues(t, 10, byName["every-one"].Skipped)
	require.EqualValues(t, 2, byName["every-skip"].Skipped)
	require.Equal(t, start.Add(15*time.Minute), byName["every-skip"].NextAt.UTC())
	require.Equal(t, start.Add(12*time.Minute), byName["every-all"].NextAt.UTC())
	require.Equal(t, start.Add(15*time.Minute), byName["cron-one"].NextAt.UTC())
	n, err = tk.Fire(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is due again")
}

// Bad schedules are refused with why; a paused schedule skips its ticks and
// resumes at the first tick after now; a deleted one is gone.
func TestScheduleControls(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for s, msg := range map[*recurring.Schedule]string{
		{Name: "x", Target: "email", What: "k", Every: time.Minute}:                 "the target is \"workflow\" or \"job\"",
		{Name: "x", Target: recurring.Job, What: "k"}:                               "give a cron spec or an interval",
		{Name: "x", Target: recurring.Job, What: "k", Every: time.Millisecond}:      "under the 1s minimum",
		{Name: "x", Target: recurring.Job, What: "k", Cron: "every tuesday"}:        "cron \"every tuesday\"",
		{Name: "x", Target: recurring.Job, What: "k", Cron: "@daily", CatchUp: "x"}: "catch-up is",
		{Name: "", Target: recurring.Job, What: "k", Cron: "@daily"}:                "the schedule name is empty",
	} {
		_, err := recurring.Add(ctx, pool, *s, start)
		require.ErrorContains(t, err, msg)
	}
	_, err := recurring.Add(ctx, pool, recurring.Schedule{Name: "m", Target: recurring.Job, What: "k", Every: time.Minute}, start)
	require.NoError(t, err)
	_, err = recurring.Add(ctx, pool, recurring.Schedule{Name: "m", Target: recurring.Job, What: "k", Every: time.Minute}, start)
	require.ErrorIs(t, err, recurring.ErrExists)
	_, err = recurring.SetPaused(ctx, pool, "m", true, start)
	require.NoError(t, err)
	later := start.Add(time.Hour + 30*time.Second)
	tk, err := recurring.NewTicker(recurring.TickerConfig{Pool: pool, Now: func() time.Time { return later }})
	require.NoError(t, err)
	n, err := tk.Fire(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "paused")
	s, err := recurring.SetPaused(ctx, pool, "m", false, later)
	require.NoError(t, err)
	require.Equal(t, start.Add(61*time.Minute), s.NextAt.UTC())
	require.NoError(t, recurring.Delete(ctx, pool, "m"))
	require.ErrorIs(t, recurring.Delete(ctx, pool, "m"), recurring.ErrNoSchedule)
}

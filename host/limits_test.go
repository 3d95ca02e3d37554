package host_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/limits"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// startLimitHosts starts two hosts of one group on b with MaxDeliveries 2
// (a held-back delivery that counted would dead-letter its job).
func startLimitHosts(t *testing.T, b *testBundle) []*hosttest.Running {
	t.Helper()
	cfg := b.config()
	cfg.PausePollInterval, cfg.MaxDeliveries = 100*time.Millisecond, 2
	return []*hosttest.Running{hosttest.Start(t, cfg), hosttest.Start(t, cfg)}
}

// setLimit sets kind's limit and waits for every host to hold it.
func setLimit(t *testing.T, b *testBundle, hosts []*hosttest.Running, l limits.Limit) limits.Limit {
	t.Helper()
	l, err := limits.Set(context.Background(), b.pool, l, "ada")
	require.NoError(t, err)
	for _, h := range hosts {
		hosttest.Eventually(t, 5*time.Second, "the limit to reach every host", func() bool {
			got, ok := h.KindLimitForTest(l.Kind)
			return ok && got.Concurrency == l.Concurrency && got.Rate == l.Rate && got.Burst == l.Burst
		})
	}
	return l
}

// requireOnceEach checks that each of the n jobs applied once, at its
// first attempt, with no retry or dead letter: a job held back is not a
// failed attempt.
func requireOnceEach(t *testing.T, b *testBundle, n int64) {
	t.Helper()
	require.Equal(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "applies")
	require.Equal(t, n, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`), "jobs applied")
	require.Equal(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict = 'applied' AND attempt = 0`))
	// A duplicate delivery absorbed is at-least-once at work; a retry, a
	// dead letter or an abandoned run would be the limit's doing.
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict NOT IN ('applied', 'absorbed')`), "failed runs")
	t.Logf("duplicates absorbed: %d", hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict = 'absorbed'`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs`))
}

// A concurrency limit of 3 set while two hosts run (16 slots each) holds
// across both: 60 counter jobs, each stalled 250 ms in its handler, never
// run more than 3 at once, and each applies once at its first attempt.
// The overlap is measured from what the jobs' own transactions wrote: a
// job's last 250 ms before its history row (its stall, or a batch-mate's)
// lie inside the time it held its permit.
func TestLimitConcurrencyTwoHosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const stall, limit, jobs = 250 * time.Millisecond, 3, 60
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "stall", Duration: stall.String()}))
	hosts := startLimitHosts(t, b)
	setLimit(t, b, hosts, limits.Limit{Kind: counterKind, Concurrency: limit})

	start := time.Now()
	want := b.placeOrders(t, jobs, 4)
	b.waitDrained(t, jobs)
	elapsed := time.Since(start)
	b.requireCounters(t, want)
	requireOnceEach(t, b, jobs)

	rows, err := b.pool.Query(context.Background(), `SELECT finished_at, consumer FROM job_history WHERE verdict = 'applied'`)
	require.NoError(t, err)
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	perHost := map[string]int{}
	for rows.Next() {
		var end time.Time
		var consumer string
		require.NoError(t, rows.Scan(&end, &consumer))
		edges = append(edges, edge{end.Add(-stall), +1}, edge{end, -1})
		perHost[consumer]++
	}
	require.NoError(t, rows.Err())
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	most, now := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	t.Logf("%d jobs, concurrency limit %d, stall %s: at most %d running at once; %s in all; per host %v",
		jobs, limit, stall, most, elapsed.Round(time.Millisecond), perHost)
	require.LessOrEqual(t, most, limit, "jobs running at once across the two hosts")
	require.Len(t, perHost, 2, "both hosts ran jobs")

	// Unlimited again without a restart.
	changed, err := limits.Unset(context.Background(), b.pool, counterKind, "ada")
	require.NoError(t, err)
	require.True(t, changed)
	for _, h := range hosts {
		hosttest.Eventually(t, 5*time.Second, "the limit gone from every host", func() bool {
			_, ok := h.KindLimitForTest(counterKind)
			return !ok
		})
	}
	acts := hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions WHERE target = $1 AND action IN ($2, $3)`,
		counterKind, limits.ActionLimit, limits.ActionUnlimit)
	require.EqualValues(t, 2, acts)
}

// A rate limit of 10 a second (burst 10) holds across two hosts: 60
// counter jobs start, by their history, no faster than the token bucket
// allows (any k consecutive starts span at least (k-burst)/rate), and each
// applies once at its first attempt.
func TestLimitRateTwoHosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rate, jobs = 10.0, 60
	hosts := startLimitHosts(t, b)
	l := setLimit(t, b, hosts, limits.Limit{Kind: counterKind, Rate: rate})
	require.Equal(t, 10, l.Burst)

	want := b.placeOrders(t, jobs, 4)
	b.waitDrained(t, jobs)
	b.requireCounters(t, want)
	requireOnceEach(t, b, jobs)

	rows, err := b.pool.Query(context.Background(), `SELECT started_at FROM job_history WHERE verdict = 'applied' ORDER BY started_at`)
	require.NoError(t, err)
	var starts []time.Time
	for rows.Next() {
		var at time.Time
		require.NoError(t, rows.Scan(&at))
		starts = append(starts, at)
	}
	require.NoError(t, rows.Err())
	require.Len(t, starts, jobs)
	// Worst window: the most starts inside any one second.
	most := 0
	for i := range starts {
		j := i
		for j < len(starts) && starts[j].Sub(starts[i]) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	span := starts[len(starts)-1].Sub(starts[0])
	sustained := float64(jobs-l.Burst) / span.Seconds()
	t.Logf("%d jobs at rate %.0f/s burst %d: most starts in one second %d; first to last %s; %.2f/s after the burst",
		jobs, rate, l.Burst, most, span.Round(time.Millisecond), sustained)
	// Token bucket: k starts need (k - burst) tokens refilled. A start's
	// history time is taken just before its token (the host's clock, the
	// bucket's is Redis's on the same machine): one start of slack.
	for i := range starts {
		for j := i + l.Burst + 1; j < len(starts); j++ {
			k := j - i + 1
			need := time.Duration(float64(k-l.Burst-1) / rate * float64(time.Second))
			require.GreaterOrEqual(t, starts[j].Sub(starts[i]), need, "starts %d..%d (%d) came faster than %v/s with burst %d", i, j, k, rate, l.Burst)
		}
	}
}

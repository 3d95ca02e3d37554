package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/workflow"
)

// flowsVersions starts a host serving the flows plugin built as version
// first, and returns it with the binaries of 1.0.0 and 2.0.0.
func flowsVersions(t *testing.T, first string) (*flows, map[string]string) {
	t.Helper()
	bins := map[string]string{
		"1.0.0": hosttest.Build(t, "./host/testdata/flows", "main.version=1.0.0"),
		"2.0.0": hosttest.Build(t, "./host/testdata/flows", "main.version=2.0.0"),
	}
	return startFlowsFrom(t, bins[first]), bins
}

// decidedOn counts trip id's decisions by the version that took them.
func (f *flows) decidedOn(t *testing.T, id string) map[string]int64 {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT d.plugin_version, count(*) FROM workflow_decisions d
		JOIN workflows w ON w.id = d.workflow WHERE w.type = 'trip' AND w.workflow_id = $1 GROUP BY 1`, id)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var v string
		var n int64
		require.NoError(t, rows.Scan(&v, &n))
		out[v] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// requireTripOnce: trip order's three steps each applied exactly once.
func requireTripOnce(t *testing.T, f *flows, order string) {
	t.Helper()
	for _, step := range []string{"reserve", "hold", "notify"} {
		require.Equal(t, int64(1), effects(t, f.pool, order, step), "order %s step %s", order, step)
	}
}

// A hot swap does not change the code under running workflows: 150 trips
// started on 1.0.0 keep being decided by 1.0.0, run beside 2.0.0 under the
// same role, while 150 started after the swap are decided by 2.0.0 (the
// thousand of issue 27 are TestCheckoutHotSwapUnderAThousand's checkouts); an
// operator then moves a set of the old ones to 2.0.0 (one of which refuses
// to move and stays), and every trip completes with each step applied
// once. Once no running workflow is pinned to 1.0.0, it is stopped.
func TestWorkflowsPinnedToTheirVersionAcrossASwap(t *testing.T) {
	t.Parallel()
	f, bins := flowsVersions(t, "1.0.0")
	ctx := context.Background()
	const half = 150
	trip := func(i int) string { return fmt.Sprintf("v%04d", i) }
	startTrips := func(from, to int) {
		for i := from; i < to; i++ {
			input := map[string]any{"order": trip(i)}
			if i == 7 {
				input["stay"] = true // refuses the migration below
			}
			_, err := client.StartWorkflow(ctx, f.pool, "trip", trip(i), input)
			require.NoError(t, err)
		}
	}
	startTrips(0, half)
	hosttest.Eventually(t, 120*time.Second, fmt.Sprintf("the first %d trips pinned to 1.0.0 by their first decision", half), func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE plugin_version = '1.0.0'`) == half
	})

	res, err := f.h.Host.Swap(ctx, "flows", bins["2.0.0"])
	require.NoError(t, err)
	require.Equal(t, "2.0.0", res.To.Version)
	startTrips(half, 2*half)
	hosttest.Eventually(t, 120*time.Second, fmt.Sprintf("the next %d trips pinned to 2.0.0", half), func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE plugin_version = '2.0.0'`) == half
	})

	// Every old trip but the first ten is paid now: their decisions run on
	// 1.0.0, which the host starts again beside 2.0.0.
	signal := func(from, to int) {
		for i := from; i < to; i++ {
			_, err := client.SignalWorkflow(ctx, f.pool, "trip", trip(i), "pay", "paid", map[string]int{"cents": 1})
			require.NoError(t, err)
		}
	}
	signal(10, 2*half)
	hosttest.Eventually(t, 180*time.Second, fmt.Sprintf("%d trips completed", 2*half-10), func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE state = 'completed'`) == 2*half-10
	})
	require.Equal(t, []string{"flows@1.0.0"}, f.h.Host.PinnedVersions(), "1.0.0 runs beside 2.0.0 while trips are pinned to it")

	// The first ten old trips are moved to 2.0.0 explicitly; trip 7
	// refuses and stays on 1.0.0.
	ids := make([]string, 0, 10)
	for i := range 10 {
		ids = append(ids, trip(i))
	}
	mres, err := f.h.Host.MigrateWorkflows(ctx, workflow.MigrateRequest{Type: "trip", From: "1.0.0", IDs: ids})
	require.NoError(t, err)
	require.Equal(t, 10, mres.Selected)
	require.Len(t, mres.Migrated, 9)
	require.Len(t, mres.Refused, 1)
	require.Equal(t, trip(7), mres.Refused[0].ID)
	require.Contains(t, mres.Refused[0].Reason, "asked to stay on 1.0.0")
	again, err := f.h.Host.MigrateWorkflows(ctx, workflow.MigrateRequest{Type: "trip", From: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, 1, again.Selected, "only the one that refused is left on 1.0.0")
	signal(0, 10)
	hosttest.Eventually(t, 120*time.Second, "every trip completed", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE state = 'completed'`) == 2*half
	})

	for i := range 2 * half {
		id := trip(i)
		requireTripOnce(t, f, id)
		f.requireDecidedOnce(t, id)
		on := f.decidedOn(t, id)
		switch {
		case i >= half:
			require.Zero(t, on["1.0.0"], "trip %s started after the swap was decided by 1.0.0", id)
		case i < 10 && i != 7:
			require.Equal(t, int64(1), f.events(t, id, "migrated"), "trip %s", id)
			require.NotZero(t, on["2.0.0"], "trip %s migrated was not decided by 2.0.0 after", id)
			require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_decisions d JOIN workflows w ON w.id = d.workflow
				WHERE w.workflow_id = $1 AND d.plugin_version = '1.0.0'
				  AND d.seq > (SELECT seq FROM workflow_events e WHERE e.workflow = w.id AND e.type = 'migrated')`, id),
				"trip %s was decided by 1.0.0 after it migrated", id)
		default:
			require.Zero(t, on["2.0.0"], "trip %s started before the swap was decided by 2.0.0", id)
		}
	}
	hosttest.Eventually(t, 30*time.Second, "1.0.0 stopped once nothing is pinned to it", func() bool {
		return len(f.h.Host.PinnedVersions()) == 0
	})
}

// A rollback and a restart strand no workflow: trips pinned to 2.0.0 keep
// 2.0.0 after a rollback to 1.0.0, and after the host is replaced by one
// that was only ever given 1.0.0's binary, which starts 2.0.0 from the
// stored copy to decide them.
func TestWorkflowsPinnedThroughRollbackAndRestart(t *testing.T) {
	t.Parallel()
	f, bins := flowsVersions(t, "1.0.0")
	ctx := context.Background()
	res, err := f.h.Host.Swap(ctx, "flows", bins["2.0.0"])
	require.NoError(t, err)
	require.Equal(t, "2.0.0", res.To.Version)
	const n = 20
	trip := func(i int) string { return fmt.Sprintf("r%02d", i) }
	for i := range n {
		_, err := client.StartWorkflow(ctx, f.pool, "trip", trip(i), map[string]string{"order": trip(i)})
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 60*time.Second, "the trips pinned to 2.0.0", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE plugin_version = '2.0.0'`) == n
	})
	rb, err := f.h.Host.Rollback(ctx, "flows")
	require.NoError(t, err)
	require.Equal(t, "1.0.0", rb.To)
	for i := range n / 2 {
		_, err := client.SignalWorkflow(ctx, f.pool, "trip", trip(i), "pay", "paid", nil)
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 60*time.Second, "the first half completed after the rollback", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE state = 'completed'`) == n/2
	})

	// Another host, given 1.0.0 only, takes over.
	require.NoError(t, f.h.Stop())
	f.h = hosttest.Start(t, f.flowsConfig(bins["1.0.0"]))
	for i := n / 2; i < n; i++ {
		_, err := client.SignalWorkflow(ctx, f.pool, "trip", trip(i), "pay", "paid", nil)
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 90*time.Second, "every trip completed on the new host", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflows WHERE state = 'completed'`) == n
	})
	for i := range n {
		requireTripOnce(t, f, trip(i))
		f.requireDecidedOnce(t, trip(i))
		require.Zero(t, f.decidedOn(t, trip(i))["1.0.0"], "trip %s pinned to 2.0.0 was decided by 1.0.0", trip(i))
	}
}

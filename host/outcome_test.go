package host_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// Every job fails its first attempt with a transient error and applies on
// its retry, a row of its own with the job's identity. Once they have
// applied, every row of every job says applied (none is left at
// retry_scheduled), and the history keeps what each attempt did: a retry,
// then an applied run.
func TestRowsShowHowTheirJobEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flaky := hosttest.Build(t, "./host/testdata/badcounters", "main.mode=flaky", "main.version=1.0.0")
	cfg := hostConfig(b.dbURL, b.rdb, b.stream, flaky)
	cfg.RetryBackoff = 100 * time.Millisecond
	const n = 20
	want := b.placeOrders(t, n, 2)
	hosttest.Start(t, cfg)
	hosttest.Eventually(t, 60*time.Second, "every job applied on its retry and every row finished", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == n &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NULL`) == 0
	})
	b.requireCounters(t, want)
	require.EqualValues(t, 2*n, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox`), "a row per attempt")
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(DISTINCT coalesce(job_id, id::text)) FROM outbox`))
	require.EqualValues(t, 2*n, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome = 'applied'`),
		"the failed attempt's row shows how its job ended")
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict = 'retry_scheduled' AND attempt = 0`))
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict = 'applied' AND attempt = 1`))
}

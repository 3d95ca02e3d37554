package jobctl_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/outbox"
)

// A cancel of a published job is a request: 'stream', recorded once
// ('already' the second time), heard by a running watcher through its
// notification (its Interval is a minute, so only the notification can
// bring it in time), and out of the set once the job ends otherwise
// (applied: a duplicate is its guard's to absorb). A job named as '042'
// is job 42's request.
func TestCancelOnStreamIsHeard(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := hosttest.DB(t)
	ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "k", Payload: json.RawMessage(`{}`)}, outbox.Message{Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox SET published_at = now()`)
	require.NoError(t, err)
	job, other := strconv.FormatInt(ids[0], 10), strconv.FormatInt(ids[1], 10)

	w, err := jobctl.NewCancelWatcher(jobctl.CancelWatcherConfig{Pool: pool, Interval: time.Minute, Logger: hosttest.Logger(t, 0)})
	require.NoError(t, err)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() { done <- w.Run(wctx, func() { close(started) }) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })
	<-started
	require.False(t, w.Cancelled(job))
	// The listener's LISTEN is in place once it has read once more
	// (it wakes a read when it starts listening); give it a moment.
	hosttest.Eventually(t, 5*time.Second, "the listener", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN `+jobctl.CancelChannel+`' AND datname = current_database()`) == 1
	})

	asked := time.Now()
	c, err := jobctl.Cancel(ctx, pool, job, "ada", "refunded")
	require.NoError(t, err)
	require.Equal(t, jobctl.WasStream, c.Was)
	require.Contains(t, c.String(), "no host will start it from now on; a run already started finishes under its guard")
	hosttest.Eventually(t, 5*time.Second, "the watcher to hear the cancel", func() bool { return w.Cancelled(job) })
	t.Logf("cancel heard %s after it was asked", time.Since(asked).Round(time.Millisecond))
	require.False(t, w.Cancelled(other))

	c, err = jobctl.Cancel(ctx, pool, "0"+job, "ada", "")
	require.NoError(t, err)
	require.Equal(t, jobctl.WasCancelled, c.Was, "asked twice (the second time as 0%s)", job)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions WHERE action = $1 AND target = $2`, jobctl.ActionCancel, job))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM job_cancels WHERE job_id = $1 AND outbox_id = $2 AND reason = 'refunded'`, job, ids[0]))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND done_at IS NULL`, ids[0]), "a request: the row is the host's to settle")

	// A host had started it before it heard: it applied.
	_, err = pool.Exec(ctx, `UPDATE outbox SET done_at = now(), outcome = 'applied' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	require.NoError(t, w.Read(ctx))
	require.False(t, w.Cancelled(job), "an applied job's cancel no longer stands")
	_, err = jobctl.Cancel(ctx, pool, job, "ada", "")
	require.ErrorContains(t, err, "has ended (applied)")
}

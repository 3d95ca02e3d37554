package jobctl_test

import (
	"encoding/json"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/outbox"
)

// Concurrent starts through one Starter each get their own answer: the
// cancelled jobs false, the others true and marked started, whichever
// batch carried them. (A host asks only for workflow steps; the answers
// are the same for any outbox row, which is what this checks. The rows
// are cancelled before they are published; once started, a cancel is
// refused.)
func TestStarterAnswersEachStart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := hosttest.DB(t)
	const n = 60
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Kind: "k", Payload: json.RawMessage(`{}`)}
	}
	ids, err := outbox.Add(ctx, pool, msgs...)
	require.NoError(t, err)
	cancelled := map[int64]bool{}
	for i := 0; i < n; i += 4 {
		c, err := jobctl.Cancel(ctx, pool, strconv.FormatInt(ids[i], 10), "test", "")
		require.NoError(t, err)
		require.Equal(t, jobctl.WasPending, c.Was)
		cancelled[ids[i]] = true
	}
	_, err = pool.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE published_at IS NULL`)
	require.NoError(t, err)
	s := jobctl.NewStarter(pool)
	got := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run, err := s.Start(ctx, id, strconv.FormatInt(id, 10), false)
			require.NoError(t, err)
			got[i] = run
		}()
	}
	wg.Wait()
	for i, id := range ids {
		require.Equal(t, !cancelled[id], got[i], "job %d", id)
	}
	require.EqualValues(t, n-len(cancelled), hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE started_at IS NOT NULL AND outcome IS NULL`))
	_, err = jobctl.Cancel(ctx, pool, strconv.FormatInt(ids[1], 10), "test", "")
	require.ErrorContains(t, err, "has started")
	require.ErrorContains(t, err, "a run finishes under its guard")
	run, err := s.Start(ctx, ids[0], strconv.FormatInt(ids[0], 10), false)
	require.NoError(t, err)
	require.False(t, run, "alone too")
}

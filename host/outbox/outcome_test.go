package outbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
)

// A retry or a requeue is a row of its own with the job's identity: when it
// gets its outcome, the job's earlier rows that ended waiting for it
// (retry_scheduled, dead_letter) take it, whichever way it is written (the
// host's Finish, or usher_applied in the job's own transaction). Another
// job's rows, and a row that ended for good, keep theirs.
func TestOutcomeFollowsTheJob(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	add := func(jobID string, attempt int) int64 {
		t.Helper()
		ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: []byte(`{}`), JobID: jobID, Attempt: attempt})
		require.NoError(t, err)
		return ids[0]
	}
	finish := func(id int64, o string) {
		t.Helper()
		require.NoError(t, outbox.Finish(ctx, pool, id, outcome.Outcome(o)))
	}
	outcome := func(id int64) string {
		t.Helper()
		var o *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT outcome FROM outbox WHERE id = $1`, id).Scan(&o))
		if o == nil {
			return ""
		}
		return *o
	}

	// Retried twice, then applied: every row says applied.
	first := add("", 0)
	job := strconv.FormatInt(first, 10)
	finish(first, "retry_scheduled")
	second := add(job, 1)
	other := add("", 0) // another job, waiting to retry
	finish(other, "retry_scheduled")
	finish(second, "retry_scheduled")
	require.Equal(t, "retry_scheduled", outcome(first), "still waiting: the job's outcome so far")
	third := add(job, 2)
	require.Equal(t, "retry_scheduled", outcome(first), "no outcome yet on the retry's row")
	finish(third, "applied")
	require.Equal(t, []string{"applied", "applied", "applied"}, []string{outcome(first), outcome(second), outcome(third)})
	require.Equal(t, "retry_scheduled", outcome(other), "another job's row")

	// Dead-lettered, requeued, retried, then dead-lettered again:
	// each row follows the latest outcome.
	dead := add("", 0)
	deadJob := strconv.FormatInt(dead, 10)
	finish(dead, "dead_letter")
	requeued := add(deadJob, 1)
	finish(requeued, "retry_scheduled")
	require.Equal(t, "retry_scheduled", outcome(dead), "requeued, waiting to retry")
	last := add(deadJob, 2)
	finish(last, "dead_letter")
	require.Equal(t, []string{"dead_letter", "dead_letter", "dead_letter"}, []string{outcome(dead), outcome(requeued), outcome(last)})

	// A scheduler-born job (s-...) has its identity on every row; an
	// absorbed row is done for good and keeps its outcome.
	s1, s2 := add("s-abc", 0), add("s-abc", 1)
	finish(s1, "retry_scheduled")
	finish(s2, "absorbed")
	require.Equal(t, "absorbed", outcome(s1))
	s3 := add("s-abc", 2)
	finish(s3, "dead_letter")
	require.Equal(t, []string{"absorbed", "absorbed", "dead_letter"}, []string{outcome(s1), outcome(s2), outcome(s3)})

	// The applied outcome written in the job's transaction by
	// usher_applied (as the owner, the function's definer) too.
	r1 := add("", 0)
	finish(r1, "retry_scheduled")
	r2 := add(strconv.FormatInt(r1, 10), 1)
	_, err := pool.Exec(ctx, `INSERT INTO plugin_kinds (kind, plugin, db_role) VALUES ('update_sales_counter', 'counters', current_user)
		ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT usher_applied($1, 'update_sales_counter')`, r2)
	require.NoError(t, err)
	require.Equal(t, []string{"applied", "applied"}, []string{outcome(r1), outcome(r2)})
}

package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/workflow"
)

// The rules of a step's cancel, on the database alone: a step that has
// not started is cancelled when its workflow is asked to cancel (a
// detached one is not), a step a host started is left to finish, and a
// workflow that ends cancels every step that has not started, detached
// or not. StepStart then refuses the cancelled ones, and only them.
func TestStepCancelRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := hosttest.DB(t)
	var wf int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM usher_start_workflow('trip', 'w1', '{}')`).Scan(&wf))
	for i, s := range []struct {
		step     string
		detached bool
	}{{"started", false}, {"waiting", false}, {"detached", true}} {
		_, err := pool.Exec(ctx, `INSERT INTO workflow_steps (workflow, step, kind, job_id, scheduled_seq, detached)
			VALUES ($1, $2, 'k', $3, usher_workflow_append($1, 'step_scheduled', $2, 'k', '{}'), $4)`,
			wf, s.step, "job-"+s.step, s.detached)
		require.NoError(t, err, i)
	}
	run, err := workflow.StepStart(ctx, pool, "job-started")
	require.NoError(t, err)
	require.True(t, run, "a step not cancelled runs")
	run, err = workflow.StepStart(ctx, pool, "not-a-step")
	require.NoError(t, err)
	require.True(t, run, "a job that is no step runs")

	var asked bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT usher_cancel_workflow('trip', 'w1', 'the buyer left')`).Scan(&asked))
	require.True(t, asked)
	state := func(step string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM workflow_steps WHERE workflow = $1 AND step = $2`, wf, step).Scan(&s))
		return s
	}
	require.Equal(t, "scheduled", state("started"), "a started step is left to finish")
	require.Equal(t, "cancelled", state("waiting"))
	require.Equal(t, "scheduled", state("detached"), "a detached step outlives the cancel request")
	for job, want := range map[string]bool{"job-started": true, "job-waiting": false, "job-detached": true} {
		run, err := workflow.StepStart(ctx, pool, job)
		require.NoError(t, err)
		require.Equal(t, want, run, job)
	}
	// job-detached started above: it too is left to finish. A detached
	// step that has not started is cancelled when the workflow ends.
	_, err = pool.Exec(ctx, `INSERT INTO workflow_steps (workflow, step, kind, job_id, scheduled_seq, detached)
		VALUES ($1, 'late', 'k', 'job-late', usher_workflow_append($1, 'step_scheduled', 'late', 'k', '{}'), true)`, wf)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE workflows SET state = 'cancelled', finished_at = now() WHERE id = $1`, wf)
	require.NoError(t, err)
	require.Equal(t, "cancelled", state("late"))
	require.Equal(t, "scheduled", state("detached"))
	run, err = workflow.StepStart(ctx, pool, "job-late")
	require.NoError(t, err)
	require.False(t, run, "nothing a workflow scheduled starts after it ended")

	var details []string
	rows, err := pool.Query(ctx, `SELECT name || ': ' || detail FROM workflow_events WHERE workflow = $1 AND type = 'step_cancelled' ORDER BY seq`, wf)
	require.NoError(t, err)
	for rows.Next() {
		var d string
		require.NoError(t, rows.Scan(&d))
		details = append(details, d)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"waiting: the workflow was asked to cancel before the step started",
		"late: the workflow ended cancelled before the step started"}, details)
}

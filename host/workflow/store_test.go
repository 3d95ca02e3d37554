package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/workflow"
)

// The list pages after a workflow, newest first, and Count says where a
// page is in the whole (before it, of the total), as the console shows
// it; workflows created in the same instant are ordered by id.
func TestListPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := hosttest.DB(t)
	// 25 of type a, the 10 oldest at one instant; 5 of type b.
	_, err := pool.Exec(ctx, `INSERT INTO workflows (type, workflow_id, state, input, request_id, trace, created_at)
		SELECT 'a', 'a' || i, 'completed', '{}', 'a:a' || i, '', now() - least(i, 16) * interval '1 second' FROM generate_series(1, 25) i;
		INSERT INTO workflows (type, workflow_id, state, input, request_id, trace)
		SELECT 'b', 'b' || i, 'running', '{}', 'b:b' || i, '' FROM generate_series(1, 5) i`)
	require.NoError(t, err)
	f := workflow.Filter{Type: "a", Limit: 10}
	var seen []string
	for page := 0; ; page++ {
		list, err := workflow.List(ctx, pool, f)
		require.NoError(t, err)
		total, before, err := workflow.Count(ctx, pool, f)
		require.NoError(t, err)
		require.EqualValues(t, 25, total)
		require.EqualValues(t, 10*page, before, "page %d", page)
		for _, w := range list {
			seen = append(seen, w.WorkflowID)
		}
		if len(list) < f.Limit {
			break
		}
		f.After = list[len(list)-1].ID
	}
	require.Len(t, seen, 25)
	require.Equal(t, []string{"a1", "a2", "a3"}, seen[:3], "newest first")
	set := map[string]bool{}
	for _, id := range seen {
		set[id] = true
	}
	require.Len(t, set, 25, "every workflow once, the ones of one instant too")
	total, before, err := workflow.Count(ctx, pool, workflow.Filter{State: "running"})
	require.NoError(t, err)
	require.EqualValues(t, 5, total)
	require.Zero(t, before)
}

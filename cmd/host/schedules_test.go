package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/recurring"
)

// schedules list --json names an interval's unit as the other durations
// do (every_ns, nanoseconds); a cron schedule has none.
func TestSchedulesListJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	now := time.Now()
	_, err := recurring.Add(ctx, pool, recurring.Schedule{Name: "every-90m", Target: recurring.Job, What: "update_sales_counter",
		Input: []byte(`{}`), Every: 90 * time.Minute, CatchUp: "one"}, now)
	require.NoError(t, err)
	_, err = recurring.Add(ctx, pool, recurring.Schedule{Name: "nightly", Target: recurring.Job, What: "update_sales_counter",
		Input: []byte(`{}`), Cron: "0 3 * * *", CatchUp: "one"}, now)
	require.NoError(t, err)
	var stdout bytes.Buffer
	cl := &cli{stdout: &stdout, stderr: os.Stderr, now: time.Now}
	require.NoError(t, cl.run(ctx, []string{"schedules", "list", "--json", "--database-url", dbURL}))
	var listed []map[string]any
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &listed))
	byName := map[string]map[string]any{}
	for _, s := range listed {
		byName[s["name"].(string)] = s
	}
	require.Len(t, byName, 2)
	require.Equal(t, float64(90*time.Minute), byName["every-90m"]["every_ns"])
	require.NotContains(t, byName["every-90m"], "every")
	require.NotContains(t, byName["nightly"], "every_ns")
	require.Equal(t, "0 3 * * *", byName["nightly"]["cron"])
}

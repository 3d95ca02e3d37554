package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
)

// The durable workflows' commands against a host running the flows test
// plugin: start (twice: the second finds it), signal (twice: counted
// once), list, show with the history and the job tree, cancel of a
// finished workflow refused.
func TestWorkflowCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	_, err := pool.Exec(ctx, `
		CREATE TABLE flow_effects (order_id text NOT NULL, step text NOT NULL, paid bigint NOT NULL, note text NOT NULL,
			at timestamptz NOT NULL DEFAULT now());
		GRANT INSERT ON flow_effects TO usher_plugin_flows`)
	require.NoError(t, err)
	hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream,
		Plugins:     []string{hosttest.Build(t, "./host/testdata/flows")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond})

	run := func(args ...string) (string, error) {
		var stdout bytes.Buffer
		cl := &cli{stdout: &stdout, stderr: os.Stderr, now: time.Now}
		err := cl.run(ctx, append(args, "--database-url", dbURL))
		return stdout.String(), err
	}
	out, err := run("workflows", "start", "trip", "c1", `{"order": "c1"}`)
	require.NoError(t, err)
	require.Regexp(t, `^trip workflow c1 started \(\d+\): running\n$`, out)
	out, err = run("workflows", "start", "trip", "c1", `{"order": "c1"}`)
	require.NoError(t, err)
	require.Regexp(t, `^trip workflow c1 exists \(\d+\): running\n$`, out)
	hosttest.Eventually(t, 60*time.Second, "trip c1 waiting for its signal", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflow_events WHERE type IN ('timer_fired', 'step_completed')`) == 3
	})
	for _, want := range []string{"received", "received before; counted once"} {
		out, err = run("workflows", "signal", "trip", "c1", "pay-1", "paid", `{"cents": 500}`)
		require.NoError(t, err)
		require.Equal(t, "signal paid (pay-1) to trip workflow c1: "+want+"\n", out)
	}
	hosttest.Eventually(t, 60*time.Second, "trip c1 completed", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflows WHERE state = 'completed'`) == 1
	})

	out, err = run("workflows", "list", "--type", "trip", "--state", "completed")
	require.NoError(t, err)
	require.Contains(t, out, "TYPE")
	require.Regexp(t, `trip\s+c1\s+completed\s+\d+\s+flows 1.0.0`, out)
	out, err = run("workflows", "list", "--state", "running")
	require.NoError(t, err)
	require.Equal(t, "no workflows\n", out)
	out, err = run("workflows", "list", "--json")
	require.NoError(t, err)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "completed", listed[0]["state"])

	out, err = run("workflows", "show", "trip:c1")
	require.NoError(t, err)
	for _, s := range []string{"workflow  trip c1", "state     completed", `result    {"paid_signals": 1}`,
		"started", "step_scheduled", "timer_fired", "signal_received", "completed", "workflow trip:c1:", "usher.workflow.trip", "flow_effect"} {
		require.Contains(t, out, s)
	}
	out, err = run("workflows", "show", "trip:c1", "--json")
	require.NoError(t, err)
	var shown struct {
		Workflow struct {
			State   string           `json:"state"`
			History []map[string]any `json:"history"`
		} `json:"workflow"`
		Jobs map[string]any `json:"jobs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, "completed", shown.Workflow.State)
	require.NotEmpty(t, shown.Workflow.History)
	require.NotEmpty(t, shown.Jobs)

	_, err = run("workflows", "cancel", "trip", "c1")
	require.ErrorContains(t, err, "trip workflow c1 is completed, not running")
	_, err = run("workflows", "signal", "trip", "nope", "s", "paid")
	require.ErrorContains(t, err, "no trip workflow nope")
	_, err = run("workflows", "start", "trip", "c2", "{not json")
	require.ErrorContains(t, err, "is not valid JSON")
}

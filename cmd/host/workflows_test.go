package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
)

// The durable workflows' commands against a host running the flows test
// plugin: start (twice: the second finds it), signal (twice: counted
// once), list, show with the history and the job tree, cancel of a
// finished workflow refused.
func TestWorkflowCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL, rdb, stream := flowsDB(t)
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

// The README's Workflows section, run as written: its Go example is the
// flows test plugin's trip decision, character for character; its grants
// let an application's role (holding nothing else) start, signal and
// cancel, and read nothing; its commands, run by sh with bin/host against
// a host running the flows plugin, say what the README says they do.
func TestREADMEWorkflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, err := os.ReadFile(filepath.Join(hosttest.ModuleRoot(t), "host", "testdata", "flows", "main.go"))
	require.NoError(t, err)
	example := strings.Join(doctest.Block(t, "docs/workflows.md", "releases on cancel:", "go"), "\n")
	require.Contains(t, string(src), "\n"+example+"\n", "the README's trip is host/testdata/flows's")

	pool, dbURL, rdb, stream := flowsDB(t)

	// The grants, to a role of the application's.
	admin, err := pgx.Connect(ctx, hosttest.AdminURL(t, dbURL))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'usher_test_app') THEN CREATE ROLE usher_test_app LOGIN; END IF;
	EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; -- created by a test running at once
	END $$`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	grants := doctest.Block(t, "docs/workflows.md", "grants it; no plugin role has any privilege on the workflow tables:", "sql")
	require.Len(t, grants, 3)
	for _, g := range grants {
		_, err := pool.Exec(ctx, strings.Replace(g, " TO app;", " TO usher_test_app", 1))
		require.NoError(t, err, g)
	}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User("usher_test_app")
	app, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer app.Close()

	hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream,
		Plugins:     []string{hosttest.Build(t, "./host/testdata/flows")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond})

	w, err := client.StartWorkflow(ctx, app, "trip", "app-1", map[string]string{"order": "app-1"})
	require.NoError(t, err)
	require.True(t, w.Started)
	_, err = client.SignalWorkflow(ctx, app, "trip", "app-1", "s1", "paid", nil)
	require.NoError(t, err)
	_, err = client.CancelWorkflow(ctx, app, "trip", "app-1", "from the app")
	require.NoError(t, err)
	_, err = app.Exec(ctx, `SELECT count(*) FROM workflows`)
	require.ErrorContains(t, err, "permission denied for table workflows")

	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "bin"), 0o755))
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/host"), filepath.Join(work, "bin", "host")))
	want := []string{`trip workflow t1 started (`, `trip workflow t1 exists (`, `signal paid (pay-1) to trip workflow t1: received`,
		`counted once`, "trip:t1\n", "workflow  trip t1", "trip workflow t2 started (", "trip workflow t2: cancel requested"}
	lines := doctest.Block(t, "docs/workflows.md", "with\na host running the flows test plugin:", "sh")
	require.Len(t, lines, len(want))
	for i, line := range lines {
		cmdline, _, _ := strings.Cut(line, "  #")
		cmd := exec.Command("sh", "-c", cmdline)
		cmd.Dir, cmd.Env = work, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "DATABASE_URL=" + dbURL}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", line, out)
		require.Contains(t, string(out), want[i], line)
	}
	hosttest.Eventually(t, 60*time.Second, "t1 completed, t2 and app-1 cancelled", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflows WHERE (workflow_id = 't1' AND state = 'completed')
			OR (workflow_id IN ('t2', 'app-1') AND state = 'cancelled')`) == 3
	})
}

// The README's migrate commands, run as written against a running host
// whose trips t1, t2 and t3 were pinned to 1.0.0 before a swap to 2.0.0:
// the first moves t1 and t2, the second the one left (t3); their next
// decisions run on 2.0.0 and each has one migrated event. A migration the
// host refuses exits non-zero, with the reason.
func TestREADMEWorkflowsMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL, rdb, stream := flowsDB(t)
	home := t.TempDir()
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream,
		Plugins:     []string{hosttest.Build(t, "./host/testdata/flows", "main.version=1.0.0")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0",
		AdminTokenFile: filepath.Join(home, ".local", "state", "usher", "admin-token")})
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	for _, id := range []string{"t1", "t2", "t3", "stays"} {
		input := map[string]any{"order": id, "stay": id == "stays"}
		_, err := client.StartWorkflow(ctx, pool, "trip", id, input)
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 60*time.Second, "the trips pinned to 1.0.0", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflows WHERE plugin_version = '1.0.0'`) == 4
	})
	_, err := h.Host.Swap(ctx, "flows", hosttest.Build(t, "./host/testdata/flows", "main.version=2.0.0"))
	require.NoError(t, err)
	// The one that refuses is cancelled first: the README's second line
	// then finds only t3.
	_, err = client.CancelWorkflow(ctx, pool, "trip", "stays", "")
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "stays cancelled (decided by 1.0.0)", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflows WHERE workflow_id = 'stays' AND state = 'cancelled'`) == 1
	})

	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "bin"), 0o755))
	bin := hosttest.Build(t, "./cmd/host")
	require.NoError(t, os.Symlink(bin, filepath.Join(work, "bin", "host")))
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "USHER_ADMIN_ADDR=" + h.AdminAddr()}
	want := []string{"2 of 2 migrated to flows 2.0.0, 0 refused", "1 of 1 migrated to flows 2.0.0, 0 refused"}
	lines := doctest.Block(t, "docs/workflows.md", "`migrated` event in its history:", "sh")
	require.Len(t, lines, len(want))
	for i, line := range lines {
		cmdline, _, _ := strings.Cut(line, "  #")
		cmd := exec.Command("sh", "-c", cmdline)
		cmd.Dir, cmd.Env = work, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", line, out)
		require.Contains(t, string(out), want[i], line)
	}
	for _, id := range []string{"t1", "t2", "t3"} {
		_, err := client.SignalWorkflow(ctx, pool, "trip", id, "pay", "paid", nil)
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 60*time.Second, "the migrated trips completed on 2.0.0", func() bool {
		return hosttest.Count(t, pool, `SELECT count(DISTINCT w.id) FROM workflows w JOIN workflow_decisions d ON d.workflow = w.id
			WHERE w.state = 'completed' AND d.plugin_version = '2.0.0' AND d.finish = 'completed'`) == 3
	})
	require.EqualValues(t, 3, hosttest.Count(t, pool, `SELECT count(*) FROM workflow_events WHERE type = 'migrated'`))

	// A migration from the version serving the type is refused by the
	// host before any plugin is asked, and the command exits non-zero.
	cmd := exec.Command(bin, "workflows", "migrate", "trip", "--from", "2.0.0")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "flows version 2.0.0 serves trip already; migrate from another version")
}

// The README's schedule commands, run as written against a host running
// the flows plugin: the schedule starts trips named nightly-trip@TICK,
// once per tick; paused it starts none; deleted it is gone.
func TestREADMESchedules(t *testing.T) {
	t.Parallel()
	pool, dbURL, rdb, stream := flowsDB(t)
	hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream,
		Plugins:     []string{hosttest.Build(t, "./host/testdata/flows")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond})
	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "bin"), 0o755))
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/host"), filepath.Join(work, "bin", "host")))
	run := func(line, want string) {
		t.Helper()
		cmdline, _, _ := strings.Cut(line, "  #")
		cmd := exec.Command("sh", "-c", cmdline)
		cmd.Dir, cmd.Env = work, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "DATABASE_URL=" + dbURL}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", line, out)
		require.Contains(t, string(out), want, line)
	}
	started := func() int64 {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflows WHERE type = 'trip' AND workflow_id LIKE 'nightly-trip@%'`)
	}
	block := doctest.Block(t, "docs/workflows.md", "paused schedule skips its ticks; resumed, its next tick is the first after\nnow. With a host running the flows test plugin:", "sh")
	require.Len(t, block, 5)
	run(block[0], "schedule nightly-trip added: starts workflow trip every 2s (catch-up one), next tick ")
	hosttest.Eventually(t, 30*time.Second, "two ticks started trips", func() bool { return started() >= 2 })
	run(block[1], "nightly-trip  starts workflow trip every 2s (catch-up one)")
	run(block[2], "schedule nightly-trip paused")
	paused := started()
	time.Sleep(5 * time.Second)
	require.Equal(t, paused, started(), "a paused schedule starts nothing")
	run(block[3], "schedule nightly-trip resumed: next tick ")
	hosttest.Eventually(t, 30*time.Second, "ticks after the resume", func() bool { return started() > paused })
	run(block[4], "schedule nightly-trip deleted")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM schedules`))
	// Each trip is one tick's: its id names the tick, a distinct time.
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM (SELECT workflow_id FROM workflows WHERE type = 'trip'
		GROUP BY workflow_id HAVING count(*) > 1) x`))
}

// flowsDB is a fresh database with the flows test plugin's table, and a
// stream of the test's own.
func flowsDB(t *testing.T) (*pgxpool.Pool, string, *redis.Client, string) {
	t.Helper()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE flow_effects (order_id text NOT NULL, step text NOT NULL, paid bigint NOT NULL, note text NOT NULL,
			at timestamptz NOT NULL DEFAULT now());
		GRANT INSERT ON flow_effects TO usher_plugin_flows`)
	require.NoError(t, err)
	return pool, dbURL, rdb, stream
}

// workflows list says when --limit cut it, with the total and the limit
// that shows them all: after the table, or on stderr under --json (whose
// stdout stays the list).
func TestWorkflowsListSaysWhenCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	_, err := pool.Exec(ctx, `INSERT INTO workflows (type, workflow_id, state, input, request_id, trace, created_at)
		SELECT 'archived', 'a' || i, 'completed', '{}', 'archived:a' || i, '', now() - i * interval '1 second' FROM generate_series(1, 130) i`)
	require.NoError(t, err)
	run := func(args ...string) (string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cl := &cli{stdout: &stdout, stderr: &stderr, now: time.Now}
		require.NoError(t, cl.run(ctx, append(args, "--database-url", dbURL)))
		return stdout.String(), stderr.String()
	}
	out, _ := run("workflows", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 102, "the header, 100 workflows and the cut")
	require.Contains(t, lines[1], "archived  a1 ", "newest first")
	require.Equal(t, "the newest 100 of 130 workflows: --limit 130 shows them all", lines[101])
	out, errOut := run("workflows", "list", "--json", "--limit", "20")
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), "stdout is the list alone")
	require.Len(t, listed, 20)
	require.Equal(t, "the newest 20 of 130 workflows: --limit 130 shows them all\n", errOut)
	out, errOut = run("workflows", "list", "--limit", "130")
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 131, "the header and every workflow, not cut")
	require.Empty(t, errOut)
	out, _ = run("workflows", "list", "--type", "archived", "--state", "running")
	require.Equal(t, "no workflows\n", out)
}

package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pause"
)

// flows is a host running the flows test plugin (host/testdata/flows)
// beside the counters plugin, on its own database and stream.
type flows struct {
	*testBundle
	h        *hosttest.Running
	crashDir string
}

func startFlows(t *testing.T) *flows {
	t.Helper()
	return startFlowsFrom(t, hosttest.Build(t, "./host/testdata/flows"))
}

// startFlowsFrom is startFlows serving the flows binary bin.
func startFlowsFrom(t *testing.T, bin string) *flows {
	t.Helper()
	f := newFlows(t)
	f.h = hosttest.Start(t, f.flowsConfig(bin))
	return f
}

// newFlows is startFlows's database and bundle, its host not started.
func newFlows(t *testing.T) *flows {
	t.Helper()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `
		CREATE TABLE flow_effects (order_id text NOT NULL, step text NOT NULL, paid bigint NOT NULL, note text NOT NULL,
			at timestamptz NOT NULL DEFAULT now());
		GRANT INSERT ON flow_effects TO usher_plugin_flows`)
	require.NoError(t, err)
	return &flows{testBundle: b, crashDir: t.TempDir()}
}

// flowsConfig is the bundle's host config serving the flows binary bin.
func (f *flows) flowsConfig(bin string) host.Config {
	cfg := f.config()
	cfg.Plugins = append(cfg.Plugins, bin)
	cfg.PluginEnv = append(cfg.PluginEnv, "FLOWS_CRASH_DIR="+f.crashDir)
	return cfg
}

func (f *flows) start(t *testing.T, id string, input any) client.Workflow {
	t.Helper()
	w, err := client.StartWorkflow(context.Background(), f.pool, "trip", id, input)
	require.NoError(t, err)
	return w
}

func (f *flows) state(t *testing.T, id string) (state, errText string) {
	t.Helper()
	var e *string
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT state, error FROM workflows WHERE type = 'trip' AND workflow_id = $1`, id).Scan(&state, &e))
	if e != nil {
		errText = *e
	}
	return state, errText
}

func (f *flows) waitState(t *testing.T, id, want string) {
	t.Helper()
	hosttest.Eventually(t, 60*time.Second, "trip "+id+" "+want, func() bool {
		s, _ := f.state(t, id)
		return s == want
	})
}

func (f *flows) events(t *testing.T, id, typ string) int64 {
	t.Helper()
	return hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_events e JOIN workflows w ON w.id = e.workflow
		WHERE w.type = 'trip' AND w.workflow_id = $1 AND e.type = $2`, id, typ)
}

func effects(t *testing.T, pool *pgxpool.Pool, order, step string) int64 {
	t.Helper()
	return hosttest.Count(t, pool, `SELECT count(*) FROM flow_effects WHERE order_id = $1 AND step = $2`, order, step)
}

// requireDecidedOnce: every decision of the workflow is recorded once, and
// no two saw the same events (their keys, the last event each saw, are
// distinct and increasing with the tasks).
func (f *flows) requireDecidedOnce(t *testing.T, id string) {
	t.Helper()
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM (SELECT d.task_job FROM workflow_decisions d
		JOIN workflows w ON w.id = d.workflow WHERE w.workflow_id = $1 GROUP BY d.task_job HAVING count(*) > 1) x`, id),
		"a decision task decided twice")
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM outbox o JOIN workflows w ON w.id = o.workflow
		WHERE w.workflow_id = $1 AND o.kind = 'usher.workflow.trip' AND o.outcome = 'applied'
		  AND NOT EXISTS (SELECT 1 FROM workflow_decisions d WHERE d.workflow = w.id AND d.task_job = o.id::text)`, id),
		"a task applied without its decision recorded")
}

// A trip runs end to end on the real plugin processes: an idempotent
// start, two steps at once (fan-out), a durable timer that fires once, a
// signal sent twice that counts once, the fan-in that waits for all of
// them, a third step, the result. A decision task relayed again after it
// was decided is absorbed: no step doubled, no decision taken twice.
func TestWorkflowTripRunsToCompletion(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()

	first := f.start(t, "t1", map[string]string{"order": "o1"})
	require.True(t, first.Started)
	require.Equal(t, "running", first.State)
	again := f.start(t, "t1", map[string]string{"order": "other input"})
	require.Equal(t, client.Workflow{ID: first.ID, State: "running", Started: false}, again, "a start of an existing id returns it")

	hosttest.Eventually(t, 60*time.Second, "reserve and hold applied, grace fired", func() bool {
		return effects(t, f.pool, "o1", "reserve") == 1 && effects(t, f.pool, "o1", "hold") == 1 &&
			f.events(t, "t1", "timer_fired") == 1 && f.events(t, "t1", "step_completed") == 2
	})
	// Nothing more happens without the signal.
	time.Sleep(500 * time.Millisecond)
	require.Zero(t, effects(t, f.pool, "o1", "notify"))
	s, _ := f.state(t, "t1")
	require.Equal(t, "running", s)

	added, err := client.SignalWorkflow(ctx, f.pool, "trip", "t1", "pay-1", "paid", map[string]int{"cents": 500})
	require.NoError(t, err)
	require.True(t, added)
	added, err = client.SignalWorkflow(ctx, f.pool, "trip", "t1", "pay-1", "paid", map[string]int{"cents": 500})
	require.NoError(t, err)
	require.False(t, added, "the same signal id counts once")

	f.waitState(t, "t1", "completed")
	var result string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT result::text FROM workflows WHERE id = $1`, first.ID).Scan(&result))
	require.JSONEq(t, `{"paid_signals": 1}`, result)
	for _, step := range []string{"reserve", "hold", "notify"} {
		require.EqualValues(t, 1, effects(t, f.pool, "o1", step), step)
	}
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM flow_effects WHERE step = 'notify' AND paid = 1`))
	// The reserve step's result, recorded by its handler in its job's
	// transaction, reached the next decision, which passed it on.
	var note, reserveResult string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT note FROM flow_effects WHERE step = 'notify'`).Scan(&note))
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT data::text FROM workflow_events WHERE workflow = $1 AND type = 'step_completed' AND name = 'reserve'`,
		first.ID).Scan(&reserveResult))
	require.Regexp(t, `^o1/reserve/\d+$`, note)
	require.JSONEq(t, `{"code": "`+note+`"}`, reserveResult)
	require.EqualValues(t, 1, f.events(t, "t1", "timer_fired"))
	require.EqualValues(t, 1, f.events(t, "t1", "signal_received"))
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_timers WHERE workflow = $1 AND fired_at IS NOT NULL`, first.ID))
	var plugin, version string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT plugin, plugin_version FROM workflows WHERE id = $1`, first.ID).Scan(&plugin, &version))
	require.Equal(t, []string{"flows", "1.0.0"}, []string{plugin, version})
	f.requireDecidedOnce(t, "t1")
	decisions := hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_decisions WHERE workflow = $1`, first.ID)

	// A relay duplicate of every decided task: each is absorbed.
	_, err = f.pool.Exec(ctx, `UPDATE outbox SET published_at = NULL, done_at = NULL, outcome = NULL
		WHERE workflow = $1 AND kind = 'usher.workflow.trip'`, first.ID)
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the redelivered tasks absorbed", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) FROM outbox WHERE workflow = $1 AND kind = 'usher.workflow.trip'
			AND outcome IS DISTINCT FROM 'absorbed'`, first.ID) == 0
	})
	require.Equal(t, decisions, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_decisions WHERE workflow = $1`, first.ID))
	for _, step := range []string{"reserve", "hold", "notify"} {
		require.EqualValues(t, 1, effects(t, f.pool, "o1", step), step)
	}
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM dead_letters`))

	// A finished workflow: a start returns it, a new signal is refused.
	done := f.start(t, "t1", map[string]string{"order": "o1"})
	require.Equal(t, client.Workflow{ID: first.ID, State: "completed"}, done)
	_, err = client.SignalWorkflow(ctx, f.pool, "trip", "t1", "pay-2", "paid", nil)
	require.ErrorContains(t, err, "trip workflow t1 is completed, not running")
	added, err = client.SignalWorkflow(ctx, f.pool, "trip", "t1", "pay-1", "paid", nil)
	require.NoError(t, err, "a signal received before counts once, even after the end")
	require.False(t, added)
	_, err = client.SignalWorkflow(ctx, f.pool, "trip", "nope", "s", "paid", nil)
	require.ErrorContains(t, err, "no trip workflow nope")
	_, err = client.CancelWorkflow(ctx, f.pool, "trip", "t1", "")
	require.ErrorContains(t, err, "trip workflow t1 is completed, not running")
}

// A cancel request is an event the next decision sees: the trip releases
// what it reserved (its compensation, a step of its own, once) and ends
// cancelled.
func TestWorkflowCancelCompensates(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()
	f.start(t, "t2", map[string]string{"order": "o2"})
	hosttest.Eventually(t, 60*time.Second, "reserve applied", func() bool { return effects(t, f.pool, "o2", "reserve") == 1 })
	asked, err := client.CancelWorkflow(ctx, f.pool, "trip", "t2", "buyer left")
	require.NoError(t, err)
	require.True(t, asked)
	asked, err = client.CancelWorkflow(ctx, f.pool, "trip", "t2", "again")
	if err == nil {
		require.False(t, asked, "a second cancel request records nothing")
	}
	f.waitState(t, "t2", "cancelled")
	require.EqualValues(t, 1, effects(t, f.pool, "o2", "release"))
	require.EqualValues(t, 1, effects(t, f.pool, "o2", "reserve"))
	require.Zero(t, effects(t, f.pool, "o2", "notify"))
	require.EqualValues(t, 1, f.events(t, "t2", "cancel_requested"))
	var result string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT result::text FROM workflows WHERE workflow_id = 't2'`).Scan(&result))
	require.JSONEq(t, `{"reason": "buyer left"}`, result)
	f.requireDecidedOnce(t, "t2")
}

// A cancel stops the steps that have not started. The trip's first two
// steps are scheduled while their kind is paused, so their entries are on
// the stream (published) and no host has started them; the cancel
// cancels both, the trip has nothing to compensate and ends cancelled,
// and once the kind is resumed the hosts take both entries and settle
// each as cancelled, running no handler.
func TestWorkflowCancelStopsStepsNotStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFlows(t)
	_, _, err := pause.Pause(ctx, f.pool, "flow_effect", "test", "hold the trip's steps")
	require.NoError(t, err)
	f.h = hosttest.Start(t, f.flowsConfig(hosttest.Build(t, "./host/testdata/flows")))
	f.start(t, "t-stop", map[string]string{"order": "o-stop"})
	steps := `FROM workflow_steps s JOIN workflows w ON w.id = s.workflow JOIN outbox o ON o.id::text = s.job_id
		WHERE w.workflow_id = 't-stop'`
	hosttest.Eventually(t, 60*time.Second, "both steps published", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) `+steps+` AND o.published_at IS NOT NULL AND s.started_at IS NULL`) == 2
	})
	_, err = client.CancelWorkflow(ctx, f.pool, "trip", "t-stop", "the buyer left")
	require.NoError(t, err)
	f.waitState(t, "t-stop", "cancelled")
	require.EqualValues(t, 2, f.events(t, "t-stop", "step_cancelled"))
	require.Zero(t, f.events(t, "t-stop", "step_completed"))

	_, err = pause.Resume(ctx, f.pool, "flow_effect", "test")
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "both step entries settled as cancelled", func() bool {
		return hosttest.Count(t, f.pool, `SELECT count(*) `+steps+` AND o.outcome = 'cancelled'`) == 2
	})
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM flow_effects WHERE order_id = 'o-stop'`), "no handler ran")
	require.EqualValues(t, 2, hosttest.Count(t, f.pool, `SELECT count(*) FROM job_history h JOIN workflow_steps s ON s.job_id = h.job_id
		JOIN workflows w ON w.id = s.workflow WHERE w.workflow_id = 't-stop' AND h.verdict = 'cancelled'`))
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) `+steps+` AND s.started_at IS NOT NULL`))
	f.requireDecidedOnce(t, "t-stop")
}

// The host validates every decision: a step of a kind the plugin may not
// enqueue, and more steps than one decision may schedule, are refused with
// an error that names what was refused; the decision task is dead-lettered
// and the workflow fails with the reason. A step whose job dead-letters is
// an event the workflow decides on (here: fail).
func TestWorkflowRefusedDecisions(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	f.start(t, "bad-kind", map[string]any{"order": "o3", "bad_kind": true})
	f.start(t, "too-many", map[string]any{"order": "o4", "too_many": true})
	f.start(t, "fail-step", map[string]any{"order": "o5", "fail_step": true})
	for _, id := range []string{"bad-kind", "too-many", "fail-step"} {
		f.waitState(t, id, "failed")
	}
	_, e := f.state(t, "bad-kind")
	require.Contains(t, e, "its decision task was dead-lettered")
	require.Contains(t, e, "role usher_plugin_flows may not enqueue kinds [update_sales_counter]")
	_, e = f.state(t, "too-many")
	require.Contains(t, e, "101 steps (children included) in one decision is over the limit of 100 (wfmsg.MaxStepsPerDecision)")
	_, e = f.state(t, "fail-step")
	require.Contains(t, e, "reserve failed: ")
	require.Contains(t, e, "this step always fails")
	require.EqualValues(t, 1, f.events(t, "fail-step", "step_failed"))
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM outbox WHERE kind = 'update_sales_counter'`), "no refused step was enqueued")
	require.Zero(t, hosttest.Count(t, f.pool, `SELECT count(*) FROM flow_effects`), "no refused step ran")
	require.EqualValues(t, 2, hosttest.Count(t, f.pool, `SELECT count(*) FROM dead_letters WHERE kind = 'usher.workflow.trip'`))
}

// The plugin killed in the middle of a workflow's first decision: the task
// runs again once the plugin is back, and its decision is taken once.
func TestWorkflowPluginKilledMidDecision(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()
	f.start(t, "t6", map[string]any{"order": "o6", "crash": true})
	hosttest.Eventually(t, 60*time.Second, "reserve and hold applied after the crash", func() bool {
		return effects(t, f.pool, "o6", "reserve") == 1 && effects(t, f.pool, "o6", "hold") == 1 &&
			f.events(t, "t6", "timer_fired") == 1
	})
	_, err := client.SignalWorkflow(ctx, f.pool, "trip", "t6", "pay", "paid", nil)
	require.NoError(t, err)
	f.waitState(t, "t6", "completed")
	for _, step := range []string{"reserve", "hold", "notify"} {
		require.EqualValues(t, 1, effects(t, f.pool, "o6", step), step)
	}
	require.EqualValues(t, 3, f.events(t, "t6", "step_scheduled"), "three steps scheduled, once each")
	f.requireDecidedOnce(t, "t6")
}

// Only the host's owner and the roles an operator grants may start,
// signal or cancel: PUBLIC and plugin roles may not, and no plugin role
// holds a privilege on the workflow tables.
func TestWorkflowFunctionsArePrivate(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
		WHERE p.proname LIKE 'usher_%workflow%' AND a.grantee = 0`),
		"PUBLIC has no EXECUTE")
	for _, table := range []string{"workflows", "workflow_events", "workflow_steps", "workflow_timers", "workflow_signals", "workflow_decisions"} {
		require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM pg_roles r WHERE r.rolname LIKE 'usher_plugin_%'
			AND has_table_privilege(r.rolname, $1, 'SELECT,INSERT,UPDATE,DELETE')`, table), table)
	}
	// A plugin's role: it may record its own kinds' step results and
	// nothing else of a workflow.
	raw := hosttest.RawPool(t, pool, 1)
	var recorded bool
	require.NoError(t, raw.QueryRow(ctx, `SELECT usher_workflow_step_result('1', 'raw_job', '{}')`).Scan(&recorded))
	require.False(t, recorded, "job 1 is no workflow step")
	_, err := raw.Exec(ctx, `SELECT usher_workflow_step_result('1', 'update_sales_counter', '{}')`)
	require.ErrorContains(t, err, "role usher_plugin_raw does not serve kind update_sales_counter")
	_, err = raw.Exec(ctx, `SELECT usher_workflow_step_result('1', 'raw_job', to_jsonb(repeat('x', 70000)))`)
	require.ErrorContains(t, err, "wfmsg.MaxStepResultBytes")
	for _, q := range []string{`SELECT * FROM usher_start_workflow('trip', 'x', '{}')`, `SELECT usher_signal_workflow('trip', 'x', 's', 'n', '{}')`,
		`SELECT usher_cancel_workflow('trip', 'x', '')`, `SELECT usher_workflow_wake(1)`, `SELECT usher_workflow_fire_timers(1)`,
		`SELECT count(*) FROM workflows`, `UPDATE workflow_timers SET fire_at = now()`} {
		_, err = raw.Exec(ctx, q)
		require.ErrorContains(t, err, "permission denied", q)
	}

	_, err = client.StartWorkflow(ctx, pool, "trip", "", nil)
	require.ErrorContains(t, err, "workflow id is empty")
	_, err = pool.Exec(ctx, `SELECT * FROM usher_start_workflow('trip', 'x', to_jsonb(repeat('x', 300000)))`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr))
	require.Contains(t, pgErr.Message, "over the 262144-byte limit (wfmsg.MaxInputBytes)")
	big, _ := json.Marshal(map[string]string{"s": string(make([]byte, 70000))})
	_, err = client.SignalWorkflow(ctx, pool, "trip", "x", "s", "n", json.RawMessage(big))
	require.ErrorContains(t, err, "wfmsg.MaxSignalBytes")
}

// A plugin written against the contract with no SDK answers decisions the
// SDK's types would never build: each is refused by the host with an error
// that names what was refused (the task dead-lettered, the workflow
// failed), while the counters plugin's jobs run on. A timer set in the
// past fires at once, and the workflow goes on.
func TestWorkflowHostileDecisions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	want := b.placeOrders(t, 10, 2)
	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, hosttest.Build(t, "./host/testdata/rawplugin"))
	cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE=workflow")
	cfg.JobTimeout, cfg.MaxAttempts = time.Second, 2
	hosttest.Start(t, cfg)

	refusals := map[string]string{
		"garbage":     "decision refused: unknown finish 99",
		"writes":      "plugin answered garbage: a decision carries writes",
		"far-timer":   "over the limit of 8784h0m0s (workflow.MaxTimerDelay)",
		"many-timers": "101 timers in one decision is over the limit of 100 (wfmsg.MaxTimersPerDecision)",
		"reuse-step":  "steps [once] were scheduled by an earlier decision: a step id is used once",
		"hang":        "failed 2 attempts (max 2): timed out after 1s",
	}
	for answer := range refusals {
		_, err := client.StartWorkflow(ctx, b.pool, "raw", answer, map[string]string{"answer": answer})
		require.NoError(t, err)
	}
	_, err := client.StartWorkflow(ctx, b.pool, "raw", "past-timer", map[string]string{"answer": "past-timer"})
	require.NoError(t, err)
	state := func(id string) (string, string) {
		var s string
		var e *string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT state, error FROM workflows WHERE type = 'raw' AND workflow_id = $1`, id).Scan(&s, &e))
		if e == nil {
			return s, ""
		}
		return s, *e
	}
	hosttest.Eventually(t, 60*time.Second, "every raw workflow ended", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM workflows WHERE state = 'running'`) == 0
	})
	for answer, msg := range refusals {
		s, e := state(answer)
		require.Equal(t, "failed", s, answer)
		require.Contains(t, e, msg, answer)
	}
	s, _ := state("past-timer")
	require.Equal(t, "completed", s, "a timer in the past fires at once")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM workflows WHERE workflow_id = 'writes' AND state <> 'failed'`))
	require.EqualValues(t, 7, hosttest.Count(t, b.pool, `SELECT count(*) FROM workflows`), "the decision's writes ran nowhere")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM workflow_steps WHERE step = 'once'`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM workflow_timers WHERE name = 'far' OR name LIKE 't%'`))
	b.requireCounters(t, want)
}

// A step whose job asks to run later ends with its retry (a delayed run
// keeping the job's identity, through a new outbox row): the step is
// completed once, by the retry, with the retry's result, and the trip goes
// on. Its timer was set at the decision's own clock and fired at once.
func TestWorkflowStepRetried(t *testing.T) {
	t.Parallel()
	f := startFlows(t)
	ctx := context.Background()
	w := f.start(t, "t7", map[string]any{"order": "o7", "flaky": true})
	hosttest.Eventually(t, 60*time.Second, "reserve applied on its retry", func() bool {
		return f.events(t, "t7", "step_completed") == 2 && f.events(t, "t7", "timer_fired") == 1
	})
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM outbox WHERE kind = 'flow_flaky' AND job_id IS NOT NULL
		AND attempt = 1 AND outcome = 'applied'`), "the step's job ran again, as a delayed run")
	require.EqualValues(t, 1, hosttest.Count(t, f.pool, `SELECT count(*) FROM workflow_events WHERE workflow = $1 AND type = 'step_completed'
		AND name = 'reserve'`, w.ID), "completed once")
	var jobID, result string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT job_id FROM workflow_steps WHERE workflow = $1 AND step = 'reserve'`, w.ID).Scan(&jobID))
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT data::text FROM workflow_events WHERE workflow = $1 AND type = 'step_completed' AND name = 'reserve'`,
		w.ID).Scan(&result))
	require.JSONEq(t, `{"code": "o7/reserve/`+jobID+`"}`, result, "the retry keeps the step's identity")
	_, err := client.SignalWorkflow(ctx, f.pool, "trip", "t7", "pay", "paid", nil)
	require.NoError(t, err)
	f.waitState(t, "t7", "completed")
	require.EqualValues(t, 1, effects(t, f.pool, "o7", "reserve"))
	require.EqualValues(t, 1, effects(t, f.pool, "o7", "notify"))
	f.requireDecidedOnce(t, "t7")
}

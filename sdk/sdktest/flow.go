package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/workflow"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk"
)

// Flow describes a workflow to prove: its decisions and its steps run
// through the host's own code (the decider that validates and commits each
// decision, the guard runner that runs each step, the database's
// triggers that record each step's end and wake the workflow) against a
// real Postgres, in-process, with no Redis and no host: what travels the
// stream in production is taken from the outbox here, in order.
//
// The clock is the test's: whenever the workflow waits (nothing to run),
// [FlowSetup.Wait] says what the test sends (signals, a cancel); when it
// sends nothing, time skips to the workflow's next timer, which fires at
// once. A workflow that waits with no timer and nothing sent ends the run
// (its state says running).
//
// Every step and decision task must be served by the one plugin
// FlowSetup.Plugin returns.
type Flow[In any] struct {
	// Plugin, Schema, Migrations, Grants and Enqueues are as in [Case].
	Plugin     string
	Schema     string
	Migrations fs.FS
	Grants     []pluginhost.Grant
	Enqueues   []string
	// Start prepares one run on its fresh database. Required.
	Start func(tb testing.TB, pool *pgxpool.Pool) FlowSetup[In]
}

// FlowSetup is one run's plugin, workflow and effects.
type FlowSetup[In any] struct {
	// Plugin serves the workflow type and every kind its steps run.
	Plugin *sdk.Plugin
	// Type and ID name the workflow; Input is its input.
	Type, ID string
	Input    In
	// Wait is asked each time the workflow waits, with its history so
	// far: what it returns is sent to the workflow (in order); nothing
	// lets time pass to the next timer. Optional.
	Wait func(w Waiting) []Send
	// Effects reads everything the workflow's steps change.
	Effects func(ctx context.Context) (any, error)
	// Want is what Effects must read once a clean run ended, checked then
	// and after every scenario, as [Setup.Want]: required, and not what
	// Effects reads before the workflow starts.
	Want any
}

// Waiting is what Wait is told: the workflow's history so far, and how
// many times it waited before in this run.
type Waiting struct {
	Events []sdk.WorkflowEvent
	Waits  int
}

// Send is one thing the test sends to a waiting workflow: a signal (Signal
// its name, SignalID its id, Payload JSON-encoded) or, with Cancel, a
// cancel request with Reason.
type Send struct {
	Signal, SignalID string
	Payload          any
	Cancel           bool
	Reason           string
}

// FlowRun is how a run of a workflow ended.
type FlowRun struct {
	// State is the workflow's: completed, failed, cancelled, or running
	// when it waits for something the test never sent.
	State string
	// Result is its result (JSON), Error why it failed.
	Result json.RawMessage
	Error  string
	// Events is its history, in order.
	Events []sdk.WorkflowEvent
	// Effects is what FlowSetup.Effects read at the end.
	Effects any
	// Decisions counts the decisions committed; Runs the handler runs
	// per step id (a crashed run and its redelivery count two).
	Decisions int
	Runs      map[string]int
}

// flowScenario is how one run of a workflow is disturbed.
type flowScenario struct {
	name string
	// stepTwice: every step's job runs again after it ended (a
	// redelivery); taskTwice: every decision task does.
	stepTwice, taskTwice bool
	// stepCrash: every step of a kind with guard stepGuard crashes there
	// on its first run, and is redelivered; taskCrash: every decision
	// task's first run dies before the plugin answers.
	stepCrash *crash
	stepGuard usherv1.Guard
	taskCrash bool
}

// RunFlow proves f's workflow: a clean run first (returned for the test's
// own assertions), then one subtest per scenario, each failing when its
// final state, result or effects differ from the clean run's: every step
// run twice, every decision task run twice, every decision task crashed
// before the plugin answered, and every step crashed at each step boundary
// of its guard and redelivered (the points [Case] crashes a job at).
func RunFlow[In any](t *testing.T, f Flow[In]) FlowRun {
	t.Helper()
	return f.each(t, func(name string, check func(testing.TB) string) {
		t.Run(name, func(t *testing.T) {
			if msg := check(t); msg != "" {
				t.Error(msg)
			}
		})
	}, func(msg string) { t.Fatal(msg) })
}

// CheckFlow is RunFlow returning one message per scenario that ended
// otherwise than the clean run (none when the workflow is exactly-once),
// and the clean run.
func CheckFlow[In any](tb testing.TB, f Flow[In]) ([]string, FlowRun) {
	tb.Helper()
	var failures []string
	note := func(msg string) { failures = append(failures, msg) }
	base := f.each(tb, func(_ string, check func(testing.TB) string) {
		if msg := check(tb); msg != "" {
			note(msg)
		}
	}, note)
	return failures, base
}

// each runs the clean run, then hands each scenario's check to each; a
// clean run that fails is given to failed instead, and nothing else runs.
func (f Flow[In]) each(tb testing.TB, each func(name string, check func(testing.TB) string), failed func(string)) FlowRun {
	tb.Helper()
	if f.Start == nil {
		tb.Fatal("sdktest: Flow.Start is required")
	}
	base, guards, err := f.run(tb, flowScenario{name: "a single clean run"})
	if err != nil {
		failed(fmt.Sprintf("sdktest: a single clean run of the workflow failed: %v", err))
		return base.FlowRun
	}
	if !sameEffects(base.Effects, base.want) {
		failed(fmt.Sprintf("%s workflow: a single clean run left other effects than the test states (FlowSetup.Want): a workflow whose steps do nothing, or do it twice, fails here\n  want:     %+v\n  this run: %+v",
			base.typ, base.want, base.Effects))
		return base.FlowRun
	}
	scenarios := []flowScenario{
		{name: "when every step runs twice", stepTwice: true},
		{name: "when every decision task runs twice", taskTwice: true},
		{name: "when every decision task crashes before the plugin answers and is redelivered", taskCrash: true},
	}
	for _, g := range guards {
		for _, s := range scenariosFor(g) {
			if s.crash != nil {
				scenarios = append(scenarios, flowScenario{name: "when every " + guardName(g) + " step " +
					strings.TrimPrefix(s.name, "when the run "), stepCrash: s.crash, stepGuard: g})
			}
		}
	}
	for _, s := range scenarios {
		each(s.name, func(tb testing.TB) string {
			got, _, err := f.run(tb, s)
			switch {
			case err != nil:
				return fmt.Sprintf("%s workflow, %s: %v", base.typ, s.name, err)
			case got.State != base.State || !jsonEqual(got.Result, base.Result) || got.Error != base.Error:
				return fmt.Sprintf("%s workflow %s ended otherwise than a single clean run:\n  clean run: %s %s %s\n  this run:  %s %s %s",
					base.typ, s.name, base.State, base.Result, base.Error, got.State, got.Result, got.Error)
			case !sameEffects(got.Effects, got.want):
				return fmt.Sprintf("%s workflow is not exactly-once %s: the effects differ from what the test states a single clean run leaves (FlowSetup.Want)\n  want:     %+v\n  this run: %+v",
					base.typ, s.name, got.want, got.Effects)
			}
			return ""
		})
	}
	return base.FlowRun
}

// guardName is how a scenario names a guard's steps.
func guardName(g usherv1.Guard) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(g.String(), "GUARD_")), "_", "-")
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	return reflect.DeepEqual(x, y)
}

// flowRun is a FlowRun with the workflow's type, for messages, and the
// effects its test states.
type flowRun struct {
	FlowRun
	typ  string
	want any
}

// maxTurns bounds a run: a workflow that keeps scheduling is reported,
// not run for ever.
const maxTurns = 10_000

// run runs the workflow once under s, on a fresh database, and returns
// how it ended and the guards of the kinds its plugin serves.
func (f Flow[In]) run(tb testing.TB, s flowScenario) (flowRun, []usherv1.Guard, error) {
	tb.Helper()
	ctx := context.Background()
	k := kit{plugin: f.Plugin, schema: f.Schema, migrations: f.Migrations, grants: f.Grants, enqueues: f.Enqueues}
	pool := k.database(tb)
	setup := f.Start(tb, pool)
	if setup.Plugin == nil || setup.Effects == nil || setup.Type == "" || setup.ID == "" {
		tb.Fatal("sdktest: Flow.Start must return a Plugin, a Type, an ID and Effects")
	}
	if err := setup.Plugin.Err(); err != nil {
		tb.Fatalf("sdktest: plugin: %v", err)
	}
	out := flowRun{typ: setup.Type, want: setup.Want, FlowRun: FlowRun{Runs: map[string]int{}}}
	before, err := setup.Effects(ctx)
	if err != nil {
		tb.Fatalf("sdktest: read effects before the run: %v", err)
	}
	if err := stated(before, setup.Want, "FlowSetup.Want"); err != nil {
		return out, nil, err
	}
	handles := guard.NewHandles("public", hosttest.Logger(tb, 100))
	runner, err := guard.NewRunner(guard.Config{Handles: handles, Logger: hosttest.Logger(tb, 100)})
	if err != nil {
		tb.Fatal(err)
	}
	m, _, err := guardOf(setup.Plugin, contract.WorkflowKind(setup.Type), handles)
	if err != nil {
		return out, nil, err
	}
	if f.Plugin != "" && m.GetName() != f.Plugin {
		tb.Fatalf("sdktest: Flow.Plugin is %q, but Start's plugin is named %q", f.Plugin, m.GetName())
	}
	guards := map[string]usherv1.Guard{}
	var distinct []usherv1.Guard
	for _, ki := range m.GetKinds() {
		if isWorkflowKind(ki.GetKind()) {
			continue
		}
		guards[ki.GetKind()] = ki.GetGuard()
		if !containsGuard(distinct, ki.GetGuard()) {
			distinct = append(distinct, ki.GetGuard())
		}
	}
	db, err := k.pluginDB(tb, pool, m)
	if err != nil {
		return out, distinct, err
	}
	defer db.Pool.Close()
	decider, err := workflow.NewDecider(workflow.Config{Pool: pool, Backoff: func(int32) time.Duration { return 0 },
		Logger: hosttest.Logger(tb, 100)})
	if err != nil {
		tb.Fatal(err)
	}
	input, err := json.Marshal(setup.Input)
	if err != nil {
		tb.Fatalf("sdktest: encode the input: %v", err)
	}
	var wf int64
	if err := pool.QueryRow(ctx, `SELECT id FROM usher_start_workflow($1, $2, $3::jsonb)`, setup.Type, setup.ID, string(input)).Scan(&wf); err != nil {
		return out, distinct, fmt.Errorf("start: %w", err)
	}
	d := &driver{pool: pool, runner: runner, handles: handles, db: db, decider: decider, plugin: setup.Plugin,
		name: m.GetName(), version: m.GetVersion(), guards: guards, s: s, out: &out}
	waits := 0
	for turn := 0; ; turn++ {
		if turn > maxTurns {
			return out, distinct, fmt.Errorf("the workflow was still running after %d turns", maxTurns)
		}
		ran, err := d.next(ctx)
		if err != nil {
			return out, distinct, err
		}
		if ran {
			continue
		}
		var state string
		if err := pool.QueryRow(ctx, `SELECT state FROM workflows WHERE id = $1`, wf).Scan(&state); err != nil {
			return out, distinct, err
		}
		if state != "running" {
			break
		}
		// Waiting: the test's sends, else the next timer.
		var sends []Send
		if setup.Wait != nil {
			events, err := readEvents(ctx, pool, wf)
			if err != nil {
				return out, distinct, err
			}
			sends = setup.Wait(Waiting{Events: events, Waits: waits})
			waits++
		}
		if len(sends) > 0 {
			if err := send(ctx, pool, setup.Type, setup.ID, sends); err != nil {
				return out, distinct, err
			}
			continue
		}
		tag, err := pool.Exec(ctx, `UPDATE workflow_timers SET fire_at = now() WHERE (workflow, name) =
			(SELECT workflow, name FROM workflow_timers WHERE workflow = $1 AND fired_at IS NULL ORDER BY fire_at, name LIMIT 1)`, wf)
		if err != nil {
			return out, distinct, err
		}
		if tag.RowsAffected() == 0 {
			break // waits for what nobody sends
		}
		if _, err := pool.Exec(ctx, `SELECT usher_workflow_fire_timers(100)`); err != nil {
			return out, distinct, err
		}
	}
	var result, errText *string
	if err := pool.QueryRow(ctx, `SELECT state, result::text, error FROM workflows WHERE id = $1`, wf).Scan(&out.State, &result, &errText); err != nil {
		return out, distinct, err
	}
	if result != nil {
		out.Result = json.RawMessage(*result)
	}
	if errText != nil {
		out.Error = *errText
	}
	if out.Events, err = readEvents(ctx, pool, wf); err != nil {
		return out, distinct, err
	}
	if out.Effects, err = setup.Effects(ctx); err != nil {
		tb.Fatalf("sdktest: read effects: %v", err)
	}
	return out, distinct, nil
}

func isWorkflowKind(kind string) bool {
	_, ok := contract.WorkflowType(kind)
	return ok
}

func containsGuard(gs []usherv1.Guard, g usherv1.Guard) bool {
	for _, x := range gs {
		if x == g {
			return true
		}
	}
	return false
}

// driver takes the outbox's rows in order, as the relay and a host would,
// and runs each.
type driver struct {
	pool          *pgxpool.Pool
	runner        *guard.Runner
	handles       *guard.Handles
	db            guard.DB
	decider       *workflow.Decider
	plugin        *sdk.Plugin
	name, version string
	guards        map[string]usherv1.Guard
	s             flowScenario
	out           *flowRun
	// ran counts each job's runs, for the scenarios that disturb the
	// first one; done lists the jobs run, for those that run them again.
	ran map[string]int
}

// next runs the outbox's first row not yet done, and reports false when
// there is none.
func (d *driver) next(ctx context.Context) (bool, error) {
	if d.ran == nil {
		d.ran = map[string]int{}
	}
	var (
		id               int64
		jobID, kind, req string
		payload, trace   string
		attempt          int32
	)
	err := d.pool.QueryRow(ctx, `UPDATE outbox SET published_at = coalesce(published_at, now())
		WHERE id = (SELECT id FROM outbox WHERE done_at IS NULL ORDER BY id LIMIT 1)
		RETURNING id, coalesce(job_id, id::text), kind, payload::text, request_id, trace, attempt`).
		Scan(&id, &jobID, &kind, &payload, &req, &trace, &attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	job := &usherv1.Job{Id: jobID, Kind: kind, Payload: []byte(payload), Attempt: attempt, RequestId: req, Trace: trace}
	if isWorkflowKind(kind) {
		return true, d.decide(ctx, id, job)
	}
	return true, d.step(ctx, id, job)
}

// decide runs one decision task to its end.
func (d *driver) decide(ctx context.Context, outboxID int64, job *usherv1.Job) error {
	runs := 1
	if d.s.taskTwice {
		runs = 2
	}
	for r := range runs {
		for attempt := 0; ; attempt++ {
			if attempt > 6 {
				return fmt.Errorf("decision task %s did not finish in 6 runs", job.GetId())
			}
			var cr *crash
			if d.s.taskCrash && d.ran[job.GetId()] == 0 {
				cr = &crash{phase: usherv1.Phase_PHASE_DECIDE, before: true}
			}
			d.ran[job.GetId()]++
			inv := newInvoker(d.plugin, d.handles, cr)
			out := d.decider.Decide(ctx, inv, d.db, job, guard.Delivery{OutboxID: outboxID, Plugin: d.name, Version: d.version,
				Started: time.Now()})
			switch out.Verdict {
			case guard.Applied:
				d.out.Decisions++
			case guard.Absorbed:
			case guard.Retry, guard.Abandoned:
				job.Attempt++
				continue
			default: // refused: its dead letter fails the workflow
				if err := d.deadLetter(ctx, outboxID, job, out); err != nil {
					return err
				}
			}
			break
		}
		if r == 0 && runs == 2 {
			job.Attempt = 0 // the redelivery of a task already decided
		}
	}
	return nil
}

// step runs one step's job to its end (applied, absorbed, cancelled or
// dead-lettered), as the host does, with the scenario's disturbance.
func (d *driver) step(ctx context.Context, outboxID int64, job *usherv1.Job) error {
	g, ok := d.guards[job.GetKind()]
	if !ok {
		return fmt.Errorf("step kind %s is not served by plugin %s (sdktest runs one plugin's workflow and steps)", job.GetKind(), d.name)
	}
	var step string
	_ = d.pool.QueryRow(ctx, `SELECT step FROM workflow_steps WHERE job_id = $1`, job.GetId()).Scan(&step)
	run, err := workflow.StepStart(ctx, d.pool, job.GetId())
	if err != nil {
		return err
	}
	if !run {
		return d.finish(ctx, outboxID, outcome.Cancelled)
	}
	runs := 1
	if d.s.stepTwice {
		runs = 2
	}
	for r := range runs {
		j := job
		if r > 0 {
			j = &usherv1.Job{Id: job.GetId(), Kind: job.GetKind(), Payload: job.GetPayload(), RequestId: job.GetRequestId(), Trace: job.GetTrace()}
		}
		if d.s.stepCrash != nil && g == d.s.stepGuard && r == 0 {
			d.out.Runs[step]++
			inv := newInvoker(d.plugin, d.handles, d.s.stepCrash)
			out := d.runner.Run(ctx, inv, d.db, g, j, guard.Delivery{OutboxID: outboxID})
			if !inv.crashed() {
				return fmt.Errorf("step %s: the crash point was never reached (the run ended %s: %s)", step, out.Verdict, out.Reason)
			}
		}
		d.out.Runs[step]++
		out, err := runToEnd(ctx, d.pool, d.runner, newInvoker(d.plugin, d.handles, nil), d.db, g, j, outboxID)
		if err != nil {
			if out.Verdict == guard.Permanent {
				return d.deadLetter(ctx, outboxID, j, out)
			}
			return fmt.Errorf("step %s: %w", step, err)
		}
		if r == 0 && !out.Recorded {
			o := outcome.Applied
			if out.Verdict == guard.Absorbed {
				o = outcome.Absorbed
			}
			if err := d.finish(ctx, outboxID, o); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish marks the outbox row with o unless its job's own transaction did
// (a job-id guard's applied run), as the host's settler does; the mark's
// trigger records the step's end in its workflow.
func (d *driver) finish(ctx context.Context, outboxID int64, o outcome.Outcome) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		return outbox.Finish(ctx, tx, outboxID, o)
	})
}

// deadLetter dead-letters a job that failed for good, with its reason, as
// the host does: the trigger fails the step (or the workflow, for a task).
func (d *driver) deadLetter(ctx context.Context, outboxID int64, job *usherv1.Job, out guard.Outcome) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := deadletter.Add(ctx, tx, deadletter.Letter{JobID: job.GetId(), Kind: job.GetKind(), Payload: job.GetPayload(),
			RequestID: job.GetRequestId(), Trace: job.GetTrace(), Attempts: int(job.GetAttempt()) + 1, Reason: out.Reason}); err != nil {
			return err
		}
		return outbox.Finish(ctx, tx, outboxID, outcome.DeadLettered)
	})
}

// send sends the test's signals and cancels to the workflow.
func send(ctx context.Context, pool *pgxpool.Pool, typ, id string, sends []Send) error {
	for i, s := range sends {
		if s.Cancel {
			if _, err := pool.Exec(ctx, `SELECT usher_cancel_workflow($1, $2, $3)`, typ, id, s.Reason); err != nil {
				return fmt.Errorf("send %d (cancel): %w", i, err)
			}
			continue
		}
		b, err := json.Marshal(s.Payload)
		if err != nil {
			return fmt.Errorf("send %d: the signal's payload does not encode: %w", i, err)
		}
		sid := s.SignalID
		if sid == "" {
			sid = s.Signal + "-" + strconv.Itoa(i)
		}
		if _, err := pool.Exec(ctx, `SELECT usher_signal_workflow($1, $2, $3, $4, $5::jsonb)`, typ, id, sid, s.Signal, string(b)); err != nil {
			return fmt.Errorf("send %d (signal %s): %w", i, s.Signal, err)
		}
	}
	return nil
}

// readEvents reads workflow wf's history.
func readEvents(ctx context.Context, pool *pgxpool.Pool, wf int64) ([]sdk.WorkflowEvent, error) {
	rows, err := pool.Query(ctx, `SELECT seq, type, name, detail, coalesce(data::text, ''), at FROM workflow_events WHERE workflow = $1 ORDER BY seq`, wf)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (sdk.WorkflowEvent, error) {
		var e sdk.WorkflowEvent
		var typ, data string
		err := r.Scan(&e.Seq, &typ, &e.Name, &e.Detail, &data, &e.At)
		e.Type = sdk.EventType(typ)
		if data != "" {
			e.Data = json.RawMessage(data)
		}
		return e, err
	})
}

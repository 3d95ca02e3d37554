package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/contract"
	"github.com/usherhq/usher/internal/jobmsg"
	"github.com/usherhq/usher/internal/wfmsg"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Limits the host adds to wfmsg's for a decision.
const (
	// MaxHistoryBytes bounds the history sent to a plugin (the input and
	// every event's data): a workflow whose history grows past it fails
	// with an error naming it, before its message could outgrow the
	// plugin connection's (contract.MaxMessageBytes).
	MaxHistoryBytes = 8 << 20
	// MaxTimerDelay bounds how far ahead a timer may be set.
	MaxTimerDelay = 366 * 24 * time.Hour
	// MaxErrorBytes bounds a failing decision's reason.
	MaxErrorBytes = 2048
)

// Commit bounds the decision's transaction. It runs under a context that
// outlives the job's, as settlement does.
const Commit = 10 * time.Second

// Config configures a Decider.
type Config struct {
	// Pool is the host's pool (the runtime owner's login). Required.
	Pool *pgxpool.Pool
	// Backoff is the delay before a decision that failed transiently (the
	// plugin's error) runs again, by attempt: the guard runner's
	// (guard.Runner.Backoff). Default 1s doubled per attempt, at most
	// guard.MaxBackoff.
	Backoff func(attempt int32) time.Duration
	// Versions finds the plugin versions workflows are pinned to (the
	// fleet). Nil: every decision runs on the version serving the type.
	Versions Versions
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Versions finds the plugin version a workflow is pinned to when the route
// serves another: running beside it, or an error (fleet.ErrVersionStarting
// while it starts; the decision runs again shortly).
type Versions interface {
	Pinned(plugin, version string) (guard.Invoker, error)
}

// VersionsFunc is a function as Versions.
type VersionsFunc func(plugin, version string) (guard.Invoker, error)

// Pinned calls f.
func (f VersionsFunc) Pinned(plugin, version string) (guard.Invoker, error) {
	return f(plugin, version)
}

// PinWait is how long a decision waits for the version its workflow is
// pinned to while that version starts.
const PinWait = 500 * time.Millisecond

// Decider answers decision tasks.
type Decider struct{ cfg Config }

// NewDecider validates cfg and fills its defaults.
func NewDecider(cfg Config) (*Decider, error) {
	if cfg.Pool == nil {
		return nil, errors.New("workflow: a decider needs a Pool")
	}
	if cfg.Backoff == nil {
		cfg.Backoff = func(attempt int32) time.Duration { return min(time.Second<<min(attempt, 16), guard.MaxBackoff) }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Decider{cfg: cfg}, nil
}

// task is a decision task's payload, as usher_workflow_wake writes it.
type task struct {
	Workflow int64 `json:"workflow"`
	Seq      int64 `json:"seq"`
}

// snapshot is a workflow as a decision reads it.
type snapshot struct {
	id               int64
	typ, wfID, state string
	taskJob          *string
	// plugin and version are the plugin version the workflow is pinned
	// to ("" before its first decision).
	plugin, version string
	lastSeq         int64
	history         *usherv1.WorkflowHistory
	historyBytes    int
}

// Decide answers one decision task: job is its delivery, inv the plugin
// serving its type, db that plugin's pool (whose role decides which kinds
// its steps may be), d the delivery's record.
func (dc *Decider) Decide(ctx context.Context, inv guard.Invoker, db guard.DB, job *usherv1.Job, d guard.Delivery) guard.Outcome {
	if d.Arrived != nil {
		d.Arrived() // a decision joins no batch
	}
	ctx = pluginhost.WithAnswered(ctx)
	out := dc.decide(ctx, inv, db, job, d)
	if out.Version == "" {
		out.Version = pluginhost.AnsweredVersion(ctx)
	}
	return out
}

func (dc *Decider) decide(ctx context.Context, inv guard.Invoker, db guard.DB, job *usherv1.Job, d guard.Delivery) guard.Outcome {
	typ, ok := contract.WorkflowType(job.GetKind())
	if !ok {
		return refused(fmt.Errorf("kind %s is served under the workflow guard but is no workflow type's (workflow kinds are %s<type>)",
			job.GetKind(), contract.WorkflowKindPrefix))
	}
	var t task
	if err := json.Unmarshal(job.GetPayload(), &t); err != nil || t.Workflow <= 0 {
		return refused(fmt.Errorf("decision task %s of %s: its payload is not a decision task's", job.GetId(), job.GetKind()))
	}
	s, err := dc.read(ctx, t.Workflow)
	if errors.Is(err, pgx.ErrNoRows) {
		return refused(fmt.Errorf("decision task %s: no workflow %d", job.GetId(), t.Workflow))
	}
	if err != nil {
		return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}
	}
	if s.typ != typ {
		return refused(fmt.Errorf("decision task %s of %s names workflow %d, of type %s", job.GetId(), job.GetKind(), t.Workflow, s.typ))
	}
	if o, done := dc.stale(ctx, dc.cfg.Pool, s, job); done {
		return o
	}
	if s.historyBytes > MaxHistoryBytes {
		return refused(fmt.Errorf("%s workflow %s: its history of %d bytes is over the %d-byte limit (workflow.MaxHistoryBytes)",
			s.typ, s.wfID, s.historyBytes, MaxHistoryBytes))
	}
	inv, o, ok := dc.pinned(inv, s, d)
	if !ok {
		return o
	}
	call := &usherv1.Call{Phase: usherv1.Phase_PHASE_DECIDE, Job: job, Workflow: s.history}
	res, err := inv.Invoke(ctx, []*usherv1.Call{call})
	if err != nil {
		err = fmt.Errorf("decide of %s workflow %s (task %s) did not complete: %w", s.typ, s.wfID, job.GetId(), err)
		return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}
	}
	if len(res) != 1 || res[0] == nil {
		return refused(fmt.Errorf("plugin answered garbage: %d results for 1 decision", len(res)))
	}
	r := res[0]
	switch r.GetOutcome() {
	case usherv1.Outcome_OUTCOME_OK:
	case usherv1.Outcome_OUTCOME_RETRY_LATER:
		return guard.Outcome{Verdict: guard.Retry, RetryAfter: guard.RetryLaterDelay(r.GetRetryAfterMs()), Reason: r.GetError()}
	case usherv1.Outcome_OUTCOME_ERROR:
		err := fmt.Errorf("decide: %s", r.GetError())
		return guard.Outcome{Verdict: guard.Retry, RetryAfter: dc.cfg.Backoff(job.GetAttempt()), Err: err, Reason: err.Error()}
	case usherv1.Outcome_OUTCOME_PERMANENT:
		return refused(fmt.Errorf("decide: %s", r.GetError()))
	default:
		return refused(fmt.Errorf("plugin answered garbage: outcome %v to a decision", r.GetOutcome()))
	}
	if len(r.GetWrites()) > 0 || r.GetClaim() != nil || len(r.GetEffectResult()) > 0 || len(r.GetState()) > 0 {
		return refused(errors.New("plugin answered garbage: a decision carries writes, a claim, an effect result or state"))
	}
	dec := r.GetDecision()
	if dec == nil {
		dec = &usherv1.Decision{}
	}
	now := time.Unix(0, s.history.GetNowUnixNanos())
	if err := check(dec, now); err != nil {
		return refused(fmt.Errorf("%s workflow %s: decision refused: %w", s.typ, s.wfID, err))
	}
	return dc.commit(ctx, db, job, d, s, dec)
}

// pinned is the invoker that decides workflow s: the version it is pinned
// to, which is the one serving its type (inv) unless a swap came since its
// first decision. While the pinned version starts, or when it cannot, the
// task runs again later (a retry, counted as any).
func (dc *Decider) pinned(inv guard.Invoker, s *snapshot, d guard.Delivery) (guard.Invoker, guard.Outcome, bool) {
	if s.version == "" || dc.cfg.Versions == nil || (s.plugin == d.Plugin && s.version == d.Version) {
		return inv, guard.Outcome{}, true
	}
	pinv, err := dc.cfg.Versions.Pinned(s.plugin, s.version)
	if err == nil {
		return pinv, guard.Outcome{}, true
	}
	// No Err: a wait for another version says nothing of the one serving
	// the type (a version on probation is not judged by it).
	err = fmt.Errorf("%s workflow %s is pinned to plugin %s version %s: %w", s.typ, s.wfID, s.plugin, s.version, err)
	return nil, guard.Outcome{Verdict: guard.Retry, RetryAfter: PinWait, Reason: err.Error()}, false
}

func refused(err error) guard.Outcome {
	return guard.Outcome{Verdict: guard.Permanent, Err: err, Reason: err.Error()}
}

// read loads workflow id and its history.
func (dc *Decider) read(ctx context.Context, id int64) (*snapshot, error) {
	s := &snapshot{id: id}
	var input []byte
	err := dc.cfg.Pool.QueryRow(ctx, `SELECT type, workflow_id, state, input::text, last_seq, task_job,
			coalesce(plugin, ''), coalesce(plugin_version, '')
		FROM workflows WHERE id = $1`, id).Scan(&s.typ, &s.wfID, &s.state, &input, &s.lastSeq, &s.taskJob, &s.plugin, &s.version)
	if err != nil {
		return nil, err
	}
	h := &usherv1.WorkflowHistory{Type: s.typ, Id: s.wfID, Input: input, NowUnixNanos: time.Now().UnixNano()}
	s.historyBytes = len(input)
	rows, err := dc.cfg.Pool.Query(ctx, `SELECT seq, type, name, detail, coalesce(data::text, ''), at
		FROM workflow_events WHERE workflow = $1 AND seq <= $2 ORDER BY seq`, id, s.lastSeq)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var e usherv1.WorkflowEvent
		var data string
		var at time.Time
		if err := rows.Scan(&e.Seq, &e.Type, &e.Name, &e.Detail, &data, &at); err != nil {
			return nil, err
		}
		e.Data, e.AtUnixNanos = []byte(data), at.UnixNano()
		s.historyBytes += len(data) + len(e.Name) + len(e.Detail)
		h.Events = append(h.Events, &e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	s.history = h
	return s, nil
}

// stale reports a task that is not its workflow's outstanding one: a
// finished workflow's, one whose decision is recorded (absorbed), or one
// the host never enqueued (refused).
func (dc *Decider) stale(ctx context.Context, q outbox.Querier, s *snapshot, job *usherv1.Job) (guard.Outcome, bool) {
	if s.state != "running" {
		return guard.Outcome{Verdict: guard.Absorbed, Reason: "workflow " + s.state}, true
	}
	if s.taskJob != nil && *s.taskJob == job.GetId() {
		return guard.Outcome{}, false
	}
	var decided bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workflow_decisions WHERE workflow = $1 AND task_job = $2)`,
		s.id, job.GetId()).Scan(&decided); err != nil {
		return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}, true
	}
	if decided {
		return guard.Outcome{Verdict: guard.Absorbed, Reason: "decision recorded"}, true
	}
	return refused(fmt.Errorf("decision task %s is not %s workflow %s's outstanding task: the host did not enqueue it", job.GetId(), s.typ, s.wfID)), true
}

// check validates a decision on its own (no database): counts, names,
// sizes, times. What needs the database (kinds, steps and timers already
// used, the history's length) is checked by commit.
func check(dec *usherv1.Decision, now time.Time) error {
	switch dec.GetFinish() {
	case usherv1.Finish_FINISH_UNSPECIFIED:
		if len(dec.GetResult()) > 0 || dec.GetError() != "" {
			return errors.New("a decision that does not finish the workflow carries a result or an error")
		}
	case usherv1.Finish_FINISH_COMPLETE, usherv1.Finish_FINISH_CANCEL, usherv1.Finish_FINISH_FAIL:
		if len(dec.GetSteps()) > 0 || len(dec.GetTimers()) > 0 || len(dec.GetChildren()) > 0 {
			return errors.New("a decision that finishes the workflow schedules no step, starts no child and sets no timer")
		}
	default:
		return fmt.Errorf("unknown finish %d", dec.GetFinish())
	}
	if n := len(dec.GetResult()); n > wfmsg.MaxInputBytes {
		return fmt.Errorf("the result of %d bytes is over the %d-byte limit (wfmsg.MaxInputBytes)", n, wfmsg.MaxInputBytes)
	}
	if len(dec.GetResult()) > 0 && !json.Valid(dec.GetResult()) {
		return errors.New("the result is not valid JSON")
	}
	if n := len(dec.GetError()); n > MaxErrorBytes {
		return fmt.Errorf("the failure's reason of %d bytes is over the %d-byte limit (workflow.MaxErrorBytes)", n, MaxErrorBytes)
	}
	if n := len(dec.GetSteps()) + len(dec.GetChildren()); n > wfmsg.MaxStepsPerDecision {
		return fmt.Errorf("%d steps (children included) in one decision is over the limit of %d (wfmsg.MaxStepsPerDecision)", n, wfmsg.MaxStepsPerDecision)
	}
	if n := len(dec.GetTimers()); n > wfmsg.MaxTimersPerDecision {
		return fmt.Errorf("%d timers in one decision is over the limit of %d (wfmsg.MaxTimersPerDecision)", n, wfmsg.MaxTimersPerDecision)
	}
	ids := map[string]bool{}
	for _, st := range dec.GetSteps() {
		if err := wfmsg.CheckName("step id", st.GetId(), wfmsg.MaxTypeBytes); err != nil {
			return err
		}
		if ids[st.GetId()] {
			return fmt.Errorf("step %q is scheduled twice", st.GetId())
		}
		ids[st.GetId()] = true
		if _, wf := contract.WorkflowType(st.GetKind()); wf || st.GetKind() == contract.WorkflowKindPrefix {
			return fmt.Errorf("step %q: kind %s is a workflow's decision task, not a step's", st.GetId(), st.GetKind())
		}
		if err := jobmsg.Check(st.GetKind(), st.GetPayload(), "", "", ""); err != nil {
			return fmt.Errorf("step %q: %w", st.GetId(), err)
		}
	}
	children := map[[2]string]bool{}
	for _, c := range dec.GetChildren() {
		if err := wfmsg.CheckName("step id", c.GetId(), wfmsg.MaxTypeBytes); err != nil {
			return err
		}
		if ids[c.GetId()] {
			return fmt.Errorf("step %q is scheduled twice", c.GetId())
		}
		ids[c.GetId()] = true
		if err := wfmsg.CheckStart(c.GetType(), c.GetWorkflowId(), c.GetInput()); err != nil {
			return fmt.Errorf("child step %q: %w", c.GetId(), err)
		}
		key := [2]string{c.GetType(), c.GetWorkflowId()}
		if children[key] {
			return fmt.Errorf("child step %q: %s workflow %s is started twice", c.GetId(), c.GetType(), c.GetWorkflowId())
		}
		children[key] = true
	}
	names := map[string]bool{}
	for _, tm := range dec.GetTimers() {
		if err := wfmsg.CheckName("timer name", tm.GetName(), wfmsg.MaxTypeBytes); err != nil {
			return err
		}
		if names[tm.GetName()] {
			return fmt.Errorf("timer %q is set twice", tm.GetName())
		}
		names[tm.GetName()] = true
		if at := time.Unix(0, tm.GetFireAtUnixNanos()); at.Sub(now) > MaxTimerDelay {
			return fmt.Errorf("timer %q is due %s after the decision's clock, over the limit of %s (workflow.MaxTimerDelay)",
				tm.GetName(), at.Sub(now).Round(time.Second), MaxTimerDelay)
		}
	}
	return nil
}

// commit records dec as the decision of the events up to s.lastSeq.
func (dc *Decider) commit(ctx context.Context, db guard.DB, job *usherv1.Job, d guard.Delivery, s *snapshot, dec *usherv1.Decision) guard.Outcome {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Commit)
	defer cancel()
	version := pluginhost.AnsweredVersion(ctx)
	if version == "" {
		version = d.Version
	}
	var out guard.Outcome
	err := pgx.BeginFunc(ctx, dc.cfg.Pool, func(tx pgx.Tx) error {
		var lastSeq int64
		var pinned string
		if dec.GetFinish() != usherv1.Finish_FINISH_UNSPECIFIED {
			// A child's end locks its parent (its step there ends with
			// it), and a cancel locks a parent before its children: lock
			// the parent first here too, so the two cannot deadlock.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM workflows WHERE id = (SELECT parent FROM workflows WHERE id = $1) FOR UPDATE`, s.id); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, `SELECT state, task_job, last_seq, coalesce(plugin_version, '') FROM workflows WHERE id = $1 FOR UPDATE`, s.id).
			Scan(&s.state, &s.taskJob, &lastSeq, &pinned); err != nil {
			return err
		}
		if o, done := dc.stale(ctx, tx, s, job); done {
			out = o
			return nil
		}
		if pinned != "" && pinned != version {
			// Migrated while this version decided: the one it moved to
			// decides.
			why := fmt.Sprintf("%s workflow %s moved to version %s while %s decided it", s.typ, s.wfID, pinned, version)
			out = guard.Outcome{Verdict: guard.Retry, RetryAfter: PinWait, Reason: why}
			return nil
		}
		if o, ok := dc.allowed(ctx, tx, db, s, dec, lastSeq); !ok {
			out = o
			return nil
		}
		tag, err := tx.Exec(ctx, `INSERT INTO workflow_decisions (workflow, seq, task_job, plugin, plugin_version, steps, timers, finish)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
			s.id, s.lastSeq, job.GetId(), d.Plugin, version, len(dec.GetSteps()), len(dec.GetTimers()), finishName(dec.GetFinish()))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			out = guard.Outcome{Verdict: guard.Absorbed, Reason: "decision recorded"}
			return nil
		}
		if err := record(ctx, tx, job, s, dec); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE workflows SET decided_seq = $2, task_job = NULL,
				plugin = coalesce(plugin, $3), plugin_version = coalesce(plugin_version, $4), updated_at = now()
			WHERE id = $1`, s.id, s.lastSeq, d.Plugin, version); err != nil {
			return err
		}
		// Events that came while the plugin decided wait for the next
		// decision: this one did not see them.
		if _, err := tx.Exec(ctx, `SELECT usher_workflow_wake($1) FROM workflows w WHERE w.id = $1 AND w.state = 'running'
			AND EXISTS (SELECT 1 FROM workflow_events e WHERE e.workflow = $1 AND e.seq > $2 AND usher_workflow_wakes(e.type))`,
			s.id, s.lastSeq); err != nil {
			return err
		}
		if err := outbox.Finish(ctx, tx, d.OutboxID, outcome.Applied); err != nil {
			return err
		}
		out = guard.Outcome{Verdict: guard.Applied, Recorded: d.OutboxID != 0, Version: version}
		if d.OutboxID == 0 {
			return nil
		}
		return history.Write(ctx, tx, history.Record{JobID: job.GetId(), Kind: job.GetKind(), OutboxID: d.OutboxID,
			RequestID: job.GetRequestId(), Attempt: int(job.GetAttempt()), Deliveries: int(d.Deliveries), StreamID: d.StreamID,
			Consumer: d.Consumer, Plugin: d.Plugin, PluginVersion: version, Guard: d.Guard, Verdict: outcome.Applied,
			StartedAt: d.Started})
	})
	if err != nil {
		err = fmt.Errorf("commit the decision of %s workflow %s: %w", s.typ, s.wfID, err)
		return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}
	}
	if out.Verdict == guard.Applied && out.Recorded && d.Committed != nil {
		d.Committed()
	}
	return out
}

// allowed checks what dec asks against the database: the kinds the
// plugin's role may enqueue, the steps and timers used before, the
// workflow's limits. A refusal is the task's permanent failure.
func (dc *Decider) allowed(ctx context.Context, tx pgx.Tx, db guard.DB, s *snapshot, dec *usherv1.Decision, lastSeq int64) (guard.Outcome, bool) {
	no := func(err error) (guard.Outcome, bool) {
		return refused(fmt.Errorf("%s workflow %s: decision refused: %w", s.typ, s.wfID, err)), false
	}
	events := lastSeq + int64(len(dec.GetSteps())+len(dec.GetChildren())+len(dec.GetTimers()))
	if dec.GetFinish() != usherv1.Finish_FINISH_UNSPECIFIED {
		events++
	}
	if events >= wfmsg.MaxEvents {
		return no(fmt.Errorf("its history would reach %d events, over the limit of %d (wfmsg.MaxEvents)", events, wfmsg.MaxEvents))
	}
	if len(dec.GetSteps())+len(dec.GetChildren()) > 0 {
		kinds := make([]string, 0, len(dec.GetSteps())+len(dec.GetChildren()))
		ids := make([]string, 0, cap(kinds))
		for _, st := range dec.GetSteps() {
			kinds, ids = append(kinds, st.GetKind()), append(ids, st.GetId())
		}
		// A child's type is the kind its decisions are: the plugin must
		// serve it or list it in its manifest's enqueues.
		for _, c := range dec.GetChildren() {
			kinds, ids = append(kinds, contract.WorkflowKind(c.GetType())), append(ids, c.GetId())
		}
		var denied, used []string
		var steps int
		err := tx.QueryRow(ctx, `SELECT
			coalesce(array(SELECT DISTINCT k FROM unnest($1::text[]) k
				WHERE NOT EXISTS (SELECT 1 FROM plugin_kinds p WHERE p.kind = k AND p.db_role = $2)
				  AND NOT EXISTS (SELECT 1 FROM plugin_enqueues p WHERE p.kind = k AND p.db_role = $2) ORDER BY k), '{}'),
			coalesce(array(SELECT step FROM workflow_steps WHERE workflow = $3 AND step = ANY($4) ORDER BY step), '{}'),
			(SELECT count(*) FROM workflow_steps WHERE workflow = $3)`, kinds, db.Role, s.id, ids).Scan(&denied, &used, &steps)
		if err != nil {
			return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}, false
		}
		switch {
		case len(denied) > 0:
			return no(fmt.Errorf("role %s may not enqueue kinds %v (not its own, and not in its manifest's enqueues)", db.Role, denied))
		case len(used) > 0:
			return no(fmt.Errorf("steps %v were scheduled by an earlier decision: a step id is used once", used))
		case steps+len(ids) > wfmsg.MaxSteps:
			return no(fmt.Errorf("%d steps over the workflow's life is over the limit of %d (wfmsg.MaxSteps)", steps+len(ids), wfmsg.MaxSteps))
		}
	}
	if len(dec.GetChildren()) > 0 {
		types := make([]string, 0, len(dec.GetChildren()))
		wfIDs := make([]string, 0, len(dec.GetChildren()))
		for _, c := range dec.GetChildren() {
			types, wfIDs = append(types, c.GetType()), append(wfIDs, c.GetWorkflowId())
		}
		var exist []string
		var children int
		err := tx.QueryRow(ctx, `SELECT
			coalesce(array(SELECT w.type || ' ' || w.workflow_id FROM workflows w JOIN unnest($1::text[], $2::text[]) u(t, i)
				ON w.type = u.t AND w.workflow_id = u.i ORDER BY 1), '{}'),
			(SELECT count(*) FROM workflows WHERE parent = $3)`, types, wfIDs, s.id).Scan(&exist, &children)
		if err != nil {
			return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}, false
		}
		switch {
		case len(exist) > 0:
			return no(fmt.Errorf("workflows %v exist: a child is a new workflow", exist))
		case children+len(types) > wfmsg.MaxChildren:
			return no(fmt.Errorf("%d children over the workflow's life is over the limit of %d (wfmsg.MaxChildren)", children+len(types), wfmsg.MaxChildren))
		}
	}
	if len(dec.GetTimers()) > 0 {
		names := make([]string, 0, len(dec.GetTimers()))
		for _, tm := range dec.GetTimers() {
			names = append(names, tm.GetName())
		}
		var used []string
		var timers int
		err := tx.QueryRow(ctx, `SELECT
			coalesce(array(SELECT name FROM workflow_timers WHERE workflow = $1 AND name = ANY($2) ORDER BY name), '{}'),
			(SELECT count(*) FROM workflow_timers WHERE workflow = $1)`, s.id, names).Scan(&used, &timers)
		if err != nil {
			return guard.Outcome{Verdict: guard.Abandoned, Err: err, Reason: err.Error()}, false
		}
		switch {
		case len(used) > 0:
			return no(fmt.Errorf("timers %v were set by an earlier decision: a timer name is used once", used))
		case timers+len(names) > wfmsg.MaxTimers:
			return no(fmt.Errorf("%d timers over the workflow's life is over the limit of %d (wfmsg.MaxTimers)", timers+len(names), wfmsg.MaxTimers))
		}
	}
	return guard.Outcome{}, true
}

// record writes what dec does: its steps' outbox rows, its timers, the
// workflow's end, each with its event.
func record(ctx context.Context, tx pgx.Tx, job *usherv1.Job, s *snapshot, dec *usherv1.Decision) error {
	for _, st := range dec.GetSteps() {
		if _, err := tx.Exec(ctx, `
			WITH o AS (INSERT INTO outbox (kind, payload, request_id, trace, workflow)
			           SELECT $2, $3::jsonb, w.request_id, w.trace, w.id FROM workflows w WHERE w.id = $1 RETURNING id),
			     e AS (SELECT usher_workflow_append($1, 'step_scheduled', $4, $2, $3::jsonb) AS seq)
			INSERT INTO workflow_steps (workflow, step, kind, job_id, scheduled_seq, detached)
			SELECT $1, $4, $2, o.id::text, e.seq, $5 FROM o, e`,
			s.id, st.GetKind(), string(st.GetPayload()), st.GetId(), st.GetDetached()); err != nil {
			return fmt.Errorf("schedule step %s: %w", st.GetId(), err)
		}
	}
	for _, c := range dec.GetChildren() {
		// A child is a new workflow (allowed checked that none has its
		// type and id; one started since makes the insert fail, and the
		// decision runs again) and a step of its parent, in that order:
		// the step's event names the child's kind, the child's start
		// wakes it.
		var child int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO workflows (type, workflow_id, input, request_id, trace, parent)
			SELECT $2, $3, $4::jsonb, $2 || ':' || $3, w.trace, w.id FROM workflows w WHERE w.id = $1
			RETURNING id`, s.id, c.GetType(), c.GetWorkflowId(), string(c.GetInput())).Scan(&child); err != nil {
			return fmt.Errorf("start child %s: %w", c.GetId(), err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO workflow_steps (workflow, step, kind, job_id, scheduled_seq)
			SELECT $1, $2, $3, 'child:' || $4::bigint, usher_workflow_append($1, 'step_scheduled', $2, $3, $5::jsonb)`,
			s.id, c.GetId(), contract.WorkflowKind(c.GetType()), child, string(c.GetInput())); err != nil {
			return fmt.Errorf("schedule child step %s: %w", c.GetId(), err)
		}
		if _, err := tx.Exec(ctx, `SELECT usher_workflow_append($1, 'started', '', $2, $3::jsonb)`,
			child, fmt.Sprintf("child of %s workflow %s (step %s)", s.typ, s.wfID, c.GetId()), string(c.GetInput())); err != nil {
			return fmt.Errorf("start child %s: %w", c.GetId(), err)
		}
	}
	for _, tm := range dec.GetTimers() {
		at := time.Unix(0, tm.GetFireAtUnixNanos()).UTC()
		data, _ := json.Marshal(map[string]time.Time{"fire_at": at})
		if _, err := tx.Exec(ctx, `
			INSERT INTO workflow_timers (workflow, name, fire_at, set_seq)
			SELECT $1, $2, $3, usher_workflow_append($1, 'timer_set', $2, '', $4::jsonb)`,
			s.id, tm.GetName(), at, string(data)); err != nil {
			return fmt.Errorf("set timer %s: %w", tm.GetName(), err)
		}
	}
	state, event := finishState(dec.GetFinish())
	if state == "" {
		return nil
	}
	var result *string
	if len(dec.GetResult()) > 0 {
		r := string(dec.GetResult())
		result = &r
	}
	if _, err := tx.Exec(ctx, `SELECT usher_workflow_append($1, $2, '', $3, $4::jsonb)`, s.id, event, dec.GetError(), result); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	var reason *string
	if dec.GetFinish() == usherv1.Finish_FINISH_FAIL {
		r := dec.GetError()
		reason = &r
	}
	_, err := tx.Exec(ctx, `UPDATE workflows SET state = $2, result = $3::jsonb, error = $4, finished_at = now() WHERE id = $1`,
		s.id, state, result, reason)
	return err
}

// finishState is the workflow state and event a finish records; "" for
// none.
func finishState(f usherv1.Finish) (state, event string) {
	switch f {
	case usherv1.Finish_FINISH_COMPLETE:
		return "completed", "completed"
	case usherv1.Finish_FINISH_FAIL:
		return "failed", "failed"
	case usherv1.Finish_FINISH_CANCEL:
		return "cancelled", "cancelled"
	}
	return "", ""
}

func finishName(f usherv1.Finish) string { s, _ := finishState(f); return s }

package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/usherhq/usher/internal/contract"
	"github.com/usherhq/usher/internal/wfmsg"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Decide is a workflow type's code: from the workflow's recorded history it
// says what happens next. The host asks for a decision whenever the
// workflow has new events (those that arrive while one is being decided
// are decided together next) and commits the Decision with the events'
// record: decisions are recorded, never replayed, so the only rule is to
// decide from the history given. It
// gets no database, no network and no clock of its own: h.Now is the
// decision's time. An error is transient (the decision runs again after a
// backoff) unless it is [Permanent], which fails the workflow; so does a
// decision the host refuses (a kind the plugin may not enqueue, a limit).
//
// Guaranteed: each event is new to exactly one committed decision, and
// a step a committed decision schedules is enqueued once. Not guaranteed:
// that Decide runs once per event. A task delivered again (its plugin
// killed mid-call, a relay duplicate, a reclaim) may call it again with
// the same or a longer history, and only one answer is committed; Decide
// must therefore do nothing but decide (its effects belong in steps);
// usher-vet reports an effect, a clock read or a database reached from it.
//
// Cancelling: a cancel request is an event (h.CancelRequested) and the
// host cancels, with it, every step that has not started and is not
// [StepCall.Detached]; a started step runs to its end. What completed is
// the workflow's to compensate, in the steps it decides next.
type Decide[In any] func(ctx context.Context, h WorkflowHistory[In]) (Decision, error)

// HandleWorkflow registers decide as workflow type typ, with input In.
// The plugin serves the kind contract.WorkflowKind(typ)
// ("usher.workflow."+typ), which its manifest lists like any kind; the
// steps a decision schedules are jobs of kinds the plugin serves or may
// enqueue, each with its own guard.
//
// A running workflow is pinned to the plugin version that took its first
// decision: after a hot swap, that version keeps deciding it (the host runs
// both versions side by side under the plugin's role) until it ends, and
// new workflows start on the new version. Steps are ordinary jobs and run
// on the version serving their kind. `host workflows migrate` moves
// running workflows to the version now serving the type, which must accept
// each one ([AcceptMigration]); a version that registered no
// AcceptMigration refuses them all.
func HandleWorkflow[In any](p *Plugin, typ string, decide Decide[In], opts ...WorkflowOption[In]) {
	if typ == "" {
		p.errs = append(p.errs, fmt.Errorf("sdk: a workflow type has no name"))
		return
	}
	kind := contract.WorkflowKind(typ)
	k := &workflowKind[In]{decide: decide,
		ki: &usherv1.KindInfo{Kind: kind, Guard: usherv1.Guard_GUARD_WORKFLOW, PayloadSchemaVersion: 1}}
	for _, o := range opts {
		o(k)
	}
	p.add(kind, k)
}

// WorkflowOption configures a workflow type (HandleWorkflow).
type WorkflowOption[In any] func(*workflowKind[In])

// AcceptMigration is how this version takes over a running workflow that
// an earlier version decided so far (`host workflows migrate`): accept
// sees its history and the version it comes from, and returns nil to
// accept it (its next decisions run here) or an error saying why not (it
// stays on its version). Like Decide it gets no database, network or
// clock; it must not change anything.
func AcceptMigration[In any](accept func(ctx context.Context, h WorkflowHistory[In], from string) error) WorkflowOption[In] {
	return func(k *workflowKind[In]) { k.accept = accept }
}

// EventType names what happened to a workflow.
type EventType string

// The events of a workflow's history.
const (
	EventStarted       EventType = "started"
	EventStepScheduled EventType = "step_scheduled"
	EventStepCompleted EventType = "step_completed"
	EventStepFailed    EventType = "step_failed"
	// EventStepCancelled: the step was cancelled before it started (its
	// workflow was asked to cancel, or ended); its job never ran and
	// never will. Detail says why.
	EventStepCancelled   EventType = "step_cancelled"
	EventTimerSet        EventType = "timer_set"
	EventTimerFired      EventType = "timer_fired"
	EventSignalReceived  EventType = "signal_received"
	EventCancelRequested EventType = "cancel_requested"
	EventCompleted       EventType = "completed"
	EventFailed          EventType = "failed"
	EventCancelled       EventType = "cancelled"
	// EventMigrated: `host workflows migrate` moved the workflow to the
	// version named (Name), from the one Detail says.
	EventMigrated EventType = "migrated"
)

// WorkflowEvent is one recorded event.
type WorkflowEvent struct {
	// Seq numbers the workflow's events from 1, in the order recorded.
	Seq  int64
	Type EventType
	// Name is the step's id, the timer's or the signal's name.
	Name string
	// Detail is the step's kind (scheduled), its job's outcome
	// (completed), why it failed (failed: the dead letter's reason), the
	// signal's id, the cancel's reason.
	Detail string
	// Data is JSON: the input (started), the step's payload (scheduled),
	// the signal's payload, {"fire_at": ...} (timer set), the result.
	Data json.RawMessage
	// At is when the host recorded it.
	At time.Time
}

// WorkflowHistory is everything a decision may decide from.
type WorkflowHistory[In any] struct {
	// Type and ID name the workflow (ID is unique per type).
	Type, ID string
	Input    In
	// Now is the decision's clock: when the host read the history. A
	// Timer's After counts from it.
	Now    time.Time
	Events []WorkflowEvent
}

// StepStatus is what the history says of one step.
type StepStatus struct {
	// Scheduled: an earlier decision scheduled it. Completed or Failed
	// once its job ended (applied, or dead-lettered with Error);
	// Cancelled when it was cancelled before it started (Error says why):
	// its job ran no handler, so it has nothing to compensate.
	Scheduled, Completed, Failed, Cancelled bool
	// Outcome is its job's final outcome ("applied", "absorbed") when
	// Completed; Error the dead letter's reason when Failed.
	Outcome, Error string
	// Result is what its handler recorded with [StepResult] (JSON), when
	// Completed; nil when it recorded none.
	Result json.RawMessage
}

// Done reports whether the step ended, any way.
func (s StepStatus) Done() bool { return s.Completed || s.Failed || s.Cancelled }

// Step reports step id's status.
func (h WorkflowHistory[In]) Step(id string) StepStatus {
	var s StepStatus
	for _, e := range h.Events {
		if e.Name != id {
			continue
		}
		switch e.Type {
		case EventStepScheduled:
			s.Scheduled = true
		case EventStepCompleted:
			s.Completed, s.Outcome, s.Result = true, e.Detail, e.Data
		case EventStepFailed:
			s.Failed, s.Error = true, e.Detail
		case EventStepCancelled:
			s.Cancelled, s.Error = true, e.Detail
		}
	}
	return s
}

// TimerSet and TimerFired report timer name's state.
func (h WorkflowHistory[In]) TimerSet(name string) bool   { return h.has(EventTimerSet, name) }
func (h WorkflowHistory[In]) TimerFired(name string) bool { return h.has(EventTimerFired, name) }

func (h WorkflowHistory[In]) has(t EventType, name string) bool {
	for _, e := range h.Events {
		if e.Type == t && e.Name == name {
			return true
		}
	}
	return false
}

// Signal is a signal the workflow received.
type Signal struct {
	ID, Name string
	Payload  json.RawMessage
	At       time.Time
}

// Signals lists the signals named name, in the order received; each signal
// id appears once however often it was sent.
func (h WorkflowHistory[In]) Signals(name string) []Signal {
	var out []Signal
	for _, e := range h.Events {
		if e.Type == EventSignalReceived && e.Name == name {
			out = append(out, Signal{ID: e.Detail, Name: e.Name, Payload: e.Data, At: e.At})
		}
	}
	return out
}

// CancelRequested reports whether the workflow was asked to cancel, and why.
func (h WorkflowHistory[In]) CancelRequested() (reason string, ok bool) {
	for _, e := range h.Events {
		if e.Type == EventCancelRequested {
			return e.Detail, true
		}
	}
	return "", false
}

// StepCall is one step a decision schedules: a job of its own kind, with
// the guard that kind was registered with. Make one with [Step].
type StepCall struct {
	id, kind string
	args     any
	// child, when set, makes the step a child workflow of that type, with
	// id childID and input args.
	child, childID string
	detached       bool
}

// Detached returns the step marked to run even if its workflow is asked
// to cancel before it starts. A step that has not started when its
// workflow is asked to cancel is cancelled (it never runs, and its
// [StepStatus] says Cancelled); a detached one runs all the same. Either
// kind is cancelled if the workflow ends before it starts: nothing a
// workflow scheduled starts after the workflow ended. A step that started
// runs to its end, retries included, whatever is asked. A child workflow
// cannot be detached (its cancel is its own; see [Child]).
func (c StepCall) Detached() StepCall {
	c.detached = true
	return c
}

// Step is step id running a job of T's kind with args. A step id is used
// once in a workflow; its events carry it.
func Step[T Args](id string, args T) StepCall {
	return StepCall{id: id, kind: args.Kind(), args: args}
}

// Child is step id starting child workflow workflowID of type typ with
// input: a new workflow, with its own history and decisions, that the
// step waits for. The step completes when the child completes, with the
// child's result as [StepStatus].Result; it fails when the child fails or
// is cancelled, with why as its Error. Asking this workflow to cancel asks
// its running children too, and a workflow that ends asks its running
// children to cancel. The plugin must serve typ, or list its kind
// (usher.workflow.typ) in its manifest's enqueues; a workflowID that
// exists already is refused (a child is a new workflow), and so are more
// than wfmsg.MaxChildren children over a workflow's life.
func Child(id, typ, workflowID string, input any) StepCall {
	return StepCall{id: id, kind: contract.WorkflowKind(typ), args: input, child: typ, childID: workflowID}
}

// Timer is a durable timer a decision sets: due After from the history's
// Now, or At (when At is set). A timer due at or before the decision's
// clock fires at the host's next timer scan. Its name is used once in a
// workflow.
type Timer struct {
	Name  string
	After time.Duration
	At    time.Time
}

// Decision is what a workflow does next: its zero value waits for the next
// event. Steps run at once (fan-out); the history shows which ended
// (fan-in). Complete, Fail and Cancelled end the workflow and schedule
// nothing.
type Decision struct {
	Steps  []StepCall
	Timers []Timer
	finish usherv1.Finish
	result any
	reason string
}

// Complete ends the workflow with result (JSON-encoded; nil for none).
func Complete(result any) Decision {
	return Decision{finish: usherv1.Finish_FINISH_COMPLETE, result: result}
}

// Fail ends the workflow as failed, with why.
func Fail(reason string) Decision {
	return Decision{finish: usherv1.Finish_FINISH_FAIL, reason: reason}
}

// Cancelled ends the workflow as cancelled (after its compensation, if it
// has one), with result.
func Cancelled(result any) Decision {
	return Decision{finish: usherv1.Finish_FINISH_CANCEL, result: result}
}

func (d Decision) proto(now time.Time) (*usherv1.Decision, error) {
	out := &usherv1.Decision{Finish: d.finish, Error: d.reason}
	if d.result != nil {
		b, err := json.Marshal(d.result)
		if err != nil {
			return nil, fmt.Errorf("the workflow's result does not encode: %w", err)
		}
		out.Result = b
	}
	for _, s := range d.Steps {
		if s.kind == "" {
			return nil, fmt.Errorf("step %q has no kind (make steps with sdk.Step)", s.id)
		}
		b, err := json.Marshal(s.args)
		if err != nil {
			return nil, fmt.Errorf("step %q: its payload does not encode: %w", s.id, err)
		}
		if s.child != "" {
			if s.detached {
				return nil, fmt.Errorf("step %q: a child workflow cannot be detached", s.id)
			}
			out.Children = append(out.Children, &usherv1.ChildCommand{Id: s.id, Type: s.child, WorkflowId: s.childID, Input: b})
			continue
		}
		out.Steps = append(out.Steps, &usherv1.StepCommand{Id: s.id, Kind: s.kind, Payload: b, Detached: s.detached})
	}
	for _, t := range d.Timers {
		at := t.At
		if at.IsZero() {
			at = now.Add(t.After)
		}
		out.Timers = append(out.Timers, &usherv1.TimerCommand{Name: t.Name, FireAtUnixNanos: at.UnixNano()})
	}
	return out, nil
}

// StepResult records v, JSON-encoded, as the result of job's workflow
// step, in the job's own transaction: w is a job-id guard's Tx (the write
// is queued with Apply's answer) or a state-first commit's Win (after its
// conditional write won). It commits with the job's effect or not at all,
// and the next decision finds it in [StepStatus].Result once the job
// applied. A job that is no running workflow step records nothing. A
// result over wfmsg.MaxStepResultBytes (64 KiB) fails the job.
func StepResult[T Args, W *Tx | *Win](ctx context.Context, w W, job Job[T], v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return Permanent(fmt.Errorf("step result of %s job %s does not encode: %w", job.Kind, job.ID, err))
	}
	if len(b) > wfmsg.MaxStepResultBytes {
		return Permanent(fmt.Errorf("step result of %s job %s of %d bytes is over the %d-byte limit (wfmsg.MaxStepResultBytes)",
			job.Kind, job.ID, len(b), wfmsg.MaxStepResultBytes))
	}
	const sql = `SELECT usher_workflow_step_result($1, $2, $3::jsonb)`
	switch w := any(w).(type) {
	case *Tx:
		w.Queue(Statement{SQL: sql, Args: []any{job.ID, job.Kind, string(b)}})
		return nil
	case *Win:
		_, err := w.Exec(ctx, sql, job.ID, job.Kind, string(b))
		return err
	}
	return nil
}

type workflowKind[In any] struct {
	decide Decide[In]
	accept func(ctx context.Context, h WorkflowHistory[In], from string) error
	ki     *usherv1.KindInfo
}

func (k *workflowKind[In]) info() *usherv1.KindInfo { return k.ki }

func (k *workflowKind[In]) invoke(ctx context.Context, _ invokeEnv, call *usherv1.Call) *usherv1.Result {
	if call.GetPhase() != usherv1.Phase_PHASE_DECIDE {
		return wrongPhase(call, "workflow")
	}
	ph := call.GetWorkflow()
	h := WorkflowHistory[In]{Type: ph.GetType(), ID: ph.GetId(), Now: time.Unix(0, ph.GetNowUnixNanos())}
	if err := json.Unmarshal(ph.GetInput(), &h.Input); err != nil {
		return result(Permanent(fmt.Errorf("input of %s workflow %s does not parse: %w", h.Type, h.ID, err)))
	}
	for _, e := range ph.GetEvents() {
		h.Events = append(h.Events, WorkflowEvent{Seq: e.GetSeq(), Type: EventType(e.GetType()), Name: e.GetName(),
			Detail: e.GetDetail(), Data: e.GetData(), At: time.Unix(0, e.GetAtUnixNanos())})
	}
	if from := ph.GetMigrateFrom(); from != "" {
		if k.accept == nil {
			return result(Permanent(fmt.Errorf("workflow type %s registers no sdk.AcceptMigration: it takes over no running workflow", h.Type)))
		}
		if err := k.accept(ctx, h, from); err != nil {
			return result(Permanent(fmt.Errorf("refused to take over %s workflow %s from version %s: %w", h.Type, h.ID, from, err)))
		}
		return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK}
	}
	d, err := k.decide(ctx, h)
	if err != nil {
		return result(err)
	}
	pd, err := d.proto(h.Now)
	if err != nil {
		return result(Permanent(err))
	}
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Decision: pd}
}

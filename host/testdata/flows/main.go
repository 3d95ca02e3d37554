// Command flows is the workflow test plugin: workflow type "trip", whose
// steps are record-the-job-id jobs writing one flow_effects row each (the
// test creates the table and grants the plugin INSERT on it).
//
// A trip reserves and holds (two steps at once) and sets a 300 ms timer
// "grace"; once both steps ended, the timer fired and a "paid" signal came,
// it notifies, with the number of paid signals it saw; once notified it
// completes. Asked to cancel, it releases what it reserved (the
// compensation) and ends cancelled. Its input can make it misbehave:
// Crash exits the process in its first decision (once, marked in
// $FLOWS_CRASH_DIR), BadKind schedules the counters plugin's kind, TooMany
// schedules more steps than one decision may, FailStep schedules a step
// whose job fails permanently (the workflow then fails on step_failed).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/usherhq/usher/sdk"
)

// Trip is the workflow's input.
type Trip struct {
	Order    string `json:"order"`
	Crash    bool   `json:"crash,omitempty"`
	BadKind  bool   `json:"bad_kind,omitempty"`
	TooMany  bool   `json:"too_many,omitempty"`
	FailStep bool   `json:"fail_step,omitempty"`
	// Flaky reserves with a step whose first attempt asks to run later.
	Flaky bool `json:"flaky,omitempty"`
	// Stay refuses a migration to another version.
	Stay bool `json:"stay,omitempty"`
}

// Effect is every step's job: one flow_effects row per applied run.
type Effect struct {
	Order string `json:"order"`
	Step  string `json:"step"`
	Paid  int    `json:"paid,omitempty"`
	// Note is written in the step's row: the notify step carries the
	// reservation code the reserve step returned as its result.
	Note string `json:"note,omitempty"`
}

func (Effect) Kind() string { return "flow_effect" }

// Fails is a step whose job fails permanently.
type Fails struct {
	Order string `json:"order"`
}

func (Fails) Kind() string { return "flow_fails" }

// Flaky is Effect's job whose first attempt asks to run again later: its
// step ends with the job's retry, which keeps the job's identity.
type Flaky Effect

func (Flaky) Kind() string { return "flow_flaky" }

type flaky struct{}

func (flaky) Apply(ctx context.Context, job sdk.Job[Flaky], tx *sdk.Tx) error {
	if job.Attempt == 0 {
		return sdk.RetryLater(100*time.Millisecond, "the first attempt always waits")
	}
	return effect{}.Apply(ctx, sdk.Job[Effect]{ID: job.ID, Kind: job.Kind, Attempt: job.Attempt, Args: Effect(job.Args)}, tx)
}

// Foreign is a kind of the counters plugin, which flows may not enqueue.
type Foreign struct {
	OrderID int64 `json:"order_id"`
}

func (Foreign) Kind() string { return "update_sales_counter" }

type effect struct{}

func (effect) Apply(ctx context.Context, job sdk.Job[Effect], tx *sdk.Tx) error {
	tx.Queue(sdk.Statement{SQL: `INSERT INTO flow_effects (order_id, step, paid, note) VALUES ($1, $2, $3, $4)`,
		Args: []any{job.Args.Order, job.Args.Step, int64(job.Args.Paid), job.Args.Note}})
	return sdk.StepResult(ctx, tx, job, map[string]string{"code": job.Args.Order + "/" + job.Args.Step + "/" + job.ID})
}

type fails struct{}

func (fails) Apply(context.Context, sdk.Job[Fails], *sdk.Tx) error {
	return sdk.Permanent(errors.New("this step always fails"))
}

// decide is the workflow type's code: the test's misbehaviours first,
// then the trip.
func decide(ctx context.Context, h sdk.WorkflowHistory[Trip]) (sdk.Decision, error) {
	if d, ok := misbehave(h); ok {
		return d, nil
	}
	return trip(ctx, h)
}

// misbehave is what the input's test flags ask of the first decision.
func misbehave(h sdk.WorkflowHistory[Trip]) (sdk.Decision, bool) {
	t := h.Input
	if t.Crash && len(h.Events) == 1 {
		marker := filepath.Join(os.Getenv("FLOWS_CRASH_DIR"), "crashed-"+h.ID)
		if _, err := os.Stat(marker); err != nil {
			_ = os.WriteFile(marker, nil, 0o644)
			os.Exit(2) // mid-decision: the host sees the plugin crash
		}
	}
	if h.Step("reserve").Scheduled {
		return sdk.Decision{}, false
	}
	switch {
	case t.BadKind:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("reserve", Foreign{OrderID: 1})}}, true
	case t.TooMany:
		var d sdk.Decision
		for i := range 101 {
			d.Steps = append(d.Steps, sdk.Step(fmt.Sprintf("s%d", i), Effect{Order: t.Order, Step: "s"}))
		}
		return d, true
	case t.FailStep:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("reserve", Fails{Order: t.Order})}}, true
	case t.Flaky:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("reserve", Flaky{Order: t.Order, Step: "reserve"}),
			sdk.Step("hold", Effect{Order: t.Order, Step: "hold"})},
			Timers: []sdk.Timer{{Name: "grace", At: h.Now}}}, true
	}
	return sdk.Decision{}, false
}

// trip decides a trip from its history (the README's example, character
// for character: cmd/host's TestREADMEWorkflows checks it).
func trip(_ context.Context, h sdk.WorkflowHistory[Trip]) (sdk.Decision, error) {
	order := h.Input.Order
	step := func(id string) sdk.StepCall { return sdk.Step(id, Effect{Order: order, Step: id}) }
	if reason, ok := h.CancelRequested(); ok { // compensate: release what was reserved
		reserve, release := h.Step("reserve"), h.Step("release")
		switch {
		case reserve.Scheduled && !reserve.Done(), release.Scheduled && !release.Done():
			return sdk.Decision{}, nil // wait for it to end
		case reserve.Completed && !release.Scheduled:
			// The compensation is detached: a cancel asked while it
			// waits to start does not cancel it.
			return sdk.Decision{Steps: []sdk.StepCall{step("release").Detached()}}, nil
		}
		return sdk.Cancelled(map[string]string{"reason": reason}), nil
	}
	if !h.Step("reserve").Scheduled { // the first decision: two steps at once and a timer
		return sdk.Decision{Steps: []sdk.StepCall{step("reserve"), step("hold")},
			Timers: []sdk.Timer{{Name: "grace", After: 300 * time.Millisecond}}}, nil
	}
	if s := h.Step("reserve"); s.Failed {
		return sdk.Fail("reserve failed: " + s.Error), nil
	}
	paid := h.Signals("paid") // a signal id counts once
	if !h.Step("notify").Scheduled {
		if !h.Step("reserve").Done() || !h.Step("hold").Done() || !h.TimerFired("grace") || len(paid) == 0 {
			return sdk.Decision{}, nil // fan-in: wait for all of them
		}
		var reserved struct {
			Code string `json:"code"` // the reserve step's result (sdk.StepResult)
		}
		if err := json.Unmarshal(h.Step("reserve").Result, &reserved); err != nil {
			return sdk.Fail(fmt.Sprintf("reserve returned no code: %s", h.Step("reserve").Result)), nil
		}
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("notify",
			Effect{Order: order, Step: "notify", Paid: len(paid), Note: reserved.Code})}}, nil
	}
	if !h.Step("notify").Done() {
		return sdk.Decision{}, nil
	}
	return sdk.Complete(map[string]int{"paid_signals": len(paid)}), nil
}

// Tour is the input of workflow type "tour": a parent whose one step is a
// child trip (ChildType and ChildID, when set, ask for a child the host
// must refuse).
type Tour struct {
	Order     string `json:"order"`
	ChildType string `json:"child_type,omitempty"`
	ChildID   string `json:"child_id,omitempty"`
}

// tour runs a trip as its child and completes with the trip's result; asked
// to cancel, it waits for the child (asked to cancel with it) to end.
func tour(_ context.Context, h sdk.WorkflowHistory[Tour]) (sdk.Decision, error) {
	child := h.Step("trip")
	if _, ok := h.CancelRequested(); ok {
		if child.Scheduled && !child.Done() {
			return sdk.Decision{}, nil
		}
		return sdk.Cancelled(map[string]any{"trip": child.Error}), nil
	}
	if !child.Scheduled {
		typ, id := "trip", "tour-"+h.ID
		if h.Input.ChildType != "" {
			typ = h.Input.ChildType
		}
		if h.Input.ChildID != "" {
			id = h.Input.ChildID
		}
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Child("trip", typ, id, Trip{Order: h.Input.Order})}}, nil
	}
	switch {
	case child.Completed:
		return sdk.Complete(map[string]json.RawMessage{"trip": child.Result}), nil
	case child.Failed:
		return sdk.Fail("its trip ended: " + child.Error), nil
	}
	return sdk.Decision{}, nil
}

// version is set at build time (-ldflags -X main.version=2.0.0): the
// versioning tests run two at once.
var version = "1.0.0"

// accept takes over a trip from another version (host workflows migrate),
// unless its input asks it to stay.
func accept(_ context.Context, h sdk.WorkflowHistory[Trip], from string) error {
	if h.Input.Stay {
		return fmt.Errorf("trip %s asked to stay on %s", h.ID, from)
	}
	return nil
}

func main() {
	p := sdk.New("flows", version)
	sdk.HandleRecordJobID(p, effect{})
	sdk.HandleRecordJobID(p, fails{})
	sdk.HandleRecordJobID(p, flaky{})
	sdk.HandleWorkflow(p, "trip", decide, sdk.AcceptMigration(accept))
	sdk.HandleWorkflow(p, "tour", tour)
	sdk.Serve(p)
}

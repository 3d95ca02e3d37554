package sdk

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

type wfStep struct {
	N int `json:"n"`
}

func (wfStep) Kind() string { return "wf_step" }

// A registered workflow type is the kind usher.workflow.<type> under the
// workflow guard; its decision sees the history through the helpers and
// its answer carries typed steps and timers counted from the history's
// clock.
func TestWorkflowDecision(t *testing.T) {
	t.Parallel()
	p := New("wf", "1.0.0")
	type in struct {
		Order string `json:"order"`
	}
	var seen WorkflowHistory[in]
	HandleWorkflow(p, "trip", func(_ context.Context, h WorkflowHistory[in]) (Decision, error) {
		seen = h
		switch h.Input.Order {
		case "perm":
			return Decision{}, Permanent(errors.New("no"))
		case "done":
			return Complete(map[string]int{"n": len(h.Signals("paid"))}), nil
		}
		return Decision{Steps: []StepCall{Step("a", wfStep{N: 1}), Step("b", wfStep{N: 2})},
			Timers: []Timer{{Name: "grace", After: time.Minute}}}, nil
	})
	require.NoError(t, p.Err())
	m := p.manifest()
	require.Len(t, m.GetKinds(), 1)
	require.Equal(t, "usher.workflow.trip", m.GetKinds()[0].GetKind())
	require.Equal(t, usherv1.Guard_GUARD_WORKFLOW, m.GetKinds()[0].GetGuard())

	now := time.Unix(1_800_000_000, 0)
	call := func(input string, events ...*usherv1.WorkflowEvent) *usherv1.Result {
		return p.kinds["usher.workflow.trip"].invoke(context.Background(), invokeEnv{}, &usherv1.Call{Phase: usherv1.Phase_PHASE_DECIDE,
			Job: &usherv1.Job{Kind: "usher.workflow.trip"}, Workflow: &usherv1.WorkflowHistory{Type: "trip", Id: "t1",
				Input: []byte(input), NowUnixNanos: now.UnixNano(), Events: events}})
	}
	res := call(`{"order": "o1"}`, &usherv1.WorkflowEvent{Seq: 1, Type: "started"})
	require.Equal(t, usherv1.Outcome_OUTCOME_OK, res.GetOutcome(), res.GetError())
	d := res.GetDecision()
	require.Len(t, d.GetSteps(), 2)
	require.Equal(t, "wf_step", d.GetSteps()[1].GetKind())
	require.JSONEq(t, `{"n": 2}`, string(d.GetSteps()[1].GetPayload()))
	require.Equal(t, now.Add(time.Minute).UnixNano(), d.GetTimers()[0].GetFireAtUnixNanos())
	require.Equal(t, "o1", seen.Input.Order)
	require.True(t, seen.Now.Equal(now))

	res = call(`{"order": "done"}`,
		&usherv1.WorkflowEvent{Seq: 2, Type: "step_scheduled", Name: "a", Detail: "wf_step"},
		&usherv1.WorkflowEvent{Seq: 3, Type: "step_completed", Name: "a", Detail: "applied"},
		&usherv1.WorkflowEvent{Seq: 4, Type: "step_scheduled", Name: "b", Detail: "wf_step"},
		&usherv1.WorkflowEvent{Seq: 5, Type: "step_failed", Name: "b", Detail: "boom"},
		&usherv1.WorkflowEvent{Seq: 6, Type: "timer_fired", Name: "grace"},
		&usherv1.WorkflowEvent{Seq: 7, Type: "signal_received", Name: "paid", Detail: "s1", Data: []byte(`{"c": 1}`)},
		&usherv1.WorkflowEvent{Seq: 8, Type: "cancel_requested", Detail: "why"})
	require.Equal(t, usherv1.Finish_FINISH_COMPLETE, res.GetDecision().GetFinish())
	require.JSONEq(t, `{"n": 1}`, string(res.GetDecision().GetResult()))
	require.Equal(t, StepStatus{Scheduled: true, Completed: true, Outcome: "applied"}, seen.Step("a"))
	require.Equal(t, StepStatus{Scheduled: true, Failed: true, Error: "boom"}, seen.Step("b"))
	require.True(t, seen.Step("b").Done())
	require.False(t, seen.Step("c").Scheduled)
	require.True(t, seen.TimerFired("grace"))
	require.False(t, seen.TimerSet("grace"))
	require.Equal(t, "s1", seen.Signals("paid")[0].ID)
	reason, ok := seen.CancelRequested()
	require.True(t, ok)
	require.Equal(t, "why", reason)

	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, call(`{"order": "perm"}`).GetOutcome())
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, call(`{`).GetOutcome(), "an input that does not parse")
	wrong := p.kinds["usher.workflow.trip"].invoke(context.Background(), invokeEnv{}, &usherv1.Call{Phase: usherv1.Phase_PHASE_APPLY})
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, wrong.GetOutcome())
}

// Asked to take over a running workflow (host workflows migrate), a type
// with no AcceptMigration refuses, one with it answers its verdict, and
// neither decides anything.
func TestWorkflowAcceptMigration(t *testing.T) {
	t.Parallel()
	type in struct {
		Order string `json:"order"`
	}
	decide := func(context.Context, WorkflowHistory[in]) (Decision, error) {
		return Complete(nil), nil
	}
	plain := New("wf", "2.0.0")
	HandleWorkflow(plain, "trip", decide)
	accepting := New("wf", "2.0.0")
	HandleWorkflow(accepting, "trip", decide, AcceptMigration(func(_ context.Context, h WorkflowHistory[in], from string) error {
		if h.Input.Order == "old" {
			return errors.New("orders of the old shape are not mine")
		}
		require.Equal(t, "1.0.0", from)
		return nil
	}))
	ask := func(p *Plugin, input string) *usherv1.Result {
		return p.kinds["usher.workflow.trip"].invoke(context.Background(), invokeEnv{}, &usherv1.Call{Phase: usherv1.Phase_PHASE_DECIDE,
			Job: &usherv1.Job{Kind: "usher.workflow.trip"}, Workflow: &usherv1.WorkflowHistory{Type: "trip", Id: "t1",
				Input: []byte(input), MigrateFrom: "1.0.0", Events: []*usherv1.WorkflowEvent{{Seq: 1, Type: "started"}}}})
	}
	res := ask(plain, `{"order": "o1"}`)
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, res.GetOutcome())
	require.Contains(t, res.GetError(), "registers no sdk.AcceptMigration")
	res = ask(accepting, `{"order": "o1"}`)
	require.Equal(t, usherv1.Outcome_OUTCOME_OK, res.GetOutcome(), res.GetError())
	require.Nil(t, res.GetDecision())
	res = ask(accepting, `{"order": "old"}`)
	require.Equal(t, usherv1.Outcome_OUTCOME_PERMANENT, res.GetOutcome())
	require.Contains(t, res.GetError(), "refused to take over trip workflow t1 from version 1.0.0: orders of the old shape are not mine")
}

// A child step is encoded as a child workflow to start, not as a job.
func TestWorkflowChildEncodes(t *testing.T) {
	t.Parallel()
	d := Decision{Steps: []StepCall{Step("a", wfStep{N: 1}), Child("c", "trip", "tour-1", map[string]string{"order": "o"})}}
	pd, err := d.proto(time.Unix(0, 0))
	require.NoError(t, err)
	require.Len(t, pd.GetSteps(), 1)
	require.Len(t, pd.GetChildren(), 1)
	c := pd.GetChildren()[0]
	require.Equal(t, "c", c.GetId())
	require.Equal(t, "trip", c.GetType())
	require.Equal(t, "tour-1", c.GetWorkflowId())
	require.JSONEq(t, `{"order": "o"}`, string(c.GetInput()))
}

package flow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/plugins/checkout/flow"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// history is a checkout of order 7 with the events given after started.
func history(events ...sdk.WorkflowEvent) sdk.WorkflowHistory[stagedoor.Checkout] {
	h := sdk.WorkflowHistory[stagedoor.Checkout]{Type: "checkout", ID: "SD-1", Now: time.Unix(1000, 0),
		Input:  stagedoor.Checkout{OrderID: 7, PayWithinMS: 5000},
		Events: []sdk.WorkflowEvent{{Type: sdk.EventStarted}}}
	for _, e := range events {
		e.Seq = int64(len(h.Events) + 1)
		h.Events = append(h.Events, e)
	}
	return h
}

func scheduled(id string) sdk.WorkflowEvent {
	return sdk.WorkflowEvent{Type: sdk.EventStepScheduled, Name: id}
}
func completed(id string) sdk.WorkflowEvent {
	return sdk.WorkflowEvent{Type: sdk.EventStepCompleted, Name: id, Detail: "applied"}
}
func cancelled(id string) sdk.WorkflowEvent {
	return sdk.WorkflowEvent{Type: sdk.EventStepCancelled, Name: id, Detail: "the workflow was asked to cancel before the step started"}
}
func failed(id string) sdk.WorkflowEvent {
	return sdk.WorkflowEvent{Type: sdk.EventStepFailed, Name: id, Detail: "permanent failure: boom"}
}

var (
	paid     = sdk.WorkflowEvent{Type: sdk.EventSignalReceived, Name: stagedoor.PaymentConfirmed, Detail: "pay-1"}
	timedOut = sdk.WorkflowEvent{Type: sdk.EventTimerFired, Name: flow.TimerPayment}
	cancel   = sdk.WorkflowEvent{Type: sdk.EventCancelRequested, Detail: "buyer left"}
	reserved = []sdk.WorkflowEvent{scheduled("reserve"), completed("reserve")}
	rendered = []sdk.WorkflowEvent{scheduled("render"), scheduled("count"), completed("count"), completed("render")}
)

func steps(calls ...sdk.StepCall) sdk.Decision { return sdk.Decision{Steps: calls} }

func join(parts ...[]sdk.WorkflowEvent) []sdk.WorkflowEvent {
	var out []sdk.WorkflowEvent
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(e ...sdk.WorkflowEvent) []sdk.WorkflowEvent { return e }

// Every turn of a checkout, decided from its history alone.
func TestCheckoutDecisions(t *testing.T) {
	t.Parallel()
	const o = 7
	wait := sdk.Decision{}
	release := steps(sdk.Step("release", stagedoor.ReleaseSeats{OrderID: o}).Detached())
	for _, c := range []struct {
		name   string
		events []sdk.WorkflowEvent
		want   sdk.Decision
	}{
		{"first: reserve, and the hold's timer", nil, sdk.Decision{
			Steps:  []sdk.StepCall{sdk.Step("reserve", stagedoor.ReserveSeats{OrderID: o})},
			Timers: []sdk.Timer{{Name: flow.TimerPayment, After: 5 * time.Second}}}},
		{"reserving, no payment yet", one(scheduled("reserve")), wait},
		{"reserved, waiting for the payment", reserved, wait},
		{"paid before the reserve ended: wait for it", one(scheduled("reserve"), paid), wait},
		{"paid: render and count at once", one(scheduled("reserve"), paid, completed("reserve")), steps(
			sdk.Step("render", stagedoor.RenderTickets{OrderID: o, SendSeparately: true}).Detached(),
			sdk.Step("count", stagedoor.UpdateSalesCounter{OrderID: o}).Detached())},
		{"one of two ended: the fan-in waits", join(reserved, one(paid, scheduled("render"), scheduled("count"), completed("count"))), wait},
		{"both ended: send", join(reserved, one(paid), rendered), steps(sdk.Step("send", stagedoor.SendTickets{OrderID: o}).Detached())},
		{"sending", join(reserved, one(paid), rendered, one(scheduled("send"))), wait},
		{"sent: complete", join(reserved, one(paid), rendered, one(scheduled("send"), completed("send"))),
			sdk.Complete(flow.Result{OrderID: o, Payment: "pay-1"})},
		{"a cancel after the payment is ignored", join(reserved, one(paid, cancel), rendered, one(scheduled("send"), completed("send"))),
			sdk.Complete(flow.Result{OrderID: o, Payment: "pay-1", CancelIgnored: "asked after the payment: buyer left"})},
		{"a payment after the timeout is too late", join(reserved, one(timedOut, paid)), release},
		{"timed out while reserving: wait for the reserve", one(scheduled("reserve"), timedOut), wait},
		{"timed out: release", join(reserved, one(timedOut)), release},
		{"cancelled: release", join(reserved, one(cancel)), release},
		{"releasing: wait", join(reserved, one(timedOut, scheduled("release"))), wait},
		{"released after the timeout: cancelled", join(reserved, one(timedOut, scheduled("release"), completed("release"))),
			sdk.Cancelled(flow.Result{OrderID: o, Cause: flow.CauseTimeout, Released: true})},
		{"released with a payment after the timeout: cancelled, naming it", join(reserved, one(timedOut, paid, scheduled("release"), completed("release"))),
			sdk.Cancelled(flow.Result{OrderID: o, Cause: flow.CauseTimeout, Released: true, LatePayment: "pay-1"})},
		{"released after a cancel: cancelled", join(reserved, one(cancel, scheduled("release"), completed("release"))),
			sdk.Cancelled(flow.Result{OrderID: o, Cause: flow.CauseCancel, Reason: "buyer left", Released: true})},
		{"cancelled before the reserve started: nothing to release", one(scheduled("reserve"), cancel, cancelled("reserve")),
			sdk.Cancelled(flow.Result{OrderID: o, Cause: flow.CauseCancel, Reason: "buyer left", NeverHeld: true})},
		{"paid, then cancelled before the reserve started: cancelled, naming the payment", one(scheduled("reserve"), paid, cancel, cancelled("reserve")),
			sdk.Cancelled(flow.Result{OrderID: o, Cause: flow.CauseCancel, Reason: "buyer left", NeverHeld: true, LatePayment: "pay-1"})},
		{"the reserve failed", one(scheduled("reserve"), failed("reserve")), sdk.Fail("reserve_seats failed: permanent failure: boom")},
		{"the release failed", join(reserved, one(cancel, scheduled("release"), failed("release"))),
			sdk.Fail("release_seats failed, the seats are still held: permanent failure: boom")},
		{"the render failed", join(reserved, one(paid, scheduled("render"), scheduled("count"), failed("render"))),
			sdk.Fail("render_tickets failed: permanent failure: boom")},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := flow.Decide(context.Background(), history(c.events...))
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

// A checkout's hold defaults to 15 minutes.
func TestPayWithinDefault(t *testing.T) {
	t.Parallel()
	require.Equal(t, 15*time.Minute, flow.PayWithin(stagedoor.Checkout{OrderID: 1}))
	require.Equal(t, 2500*time.Millisecond, flow.PayWithin(stagedoor.Checkout{OrderID: 1, PayWithinMS: 2500}))
}

// A checkout is taken over from another version when every event of its
// history is one this code decides from.
func TestAcceptMigration(t *testing.T) {
	t.Parallel()
	h := sdk.WorkflowHistory[stagedoor.Checkout]{ID: "c1", Events: []sdk.WorkflowEvent{
		{Seq: 1, Type: sdk.EventStarted}, {Seq: 2, Type: sdk.EventStepScheduled}, {Seq: 3, Type: sdk.EventTimerSet}}}
	require.NoError(t, flow.Accept(context.Background(), h, "1.0.0"))
	h.Events = append(h.Events, sdk.WorkflowEvent{Seq: 4, Type: "child_started"})
	require.ErrorContains(t, flow.Accept(context.Background(), h, "1.0.0"), "has a child_started event (#4), which this version does not decide from")
}

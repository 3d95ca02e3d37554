// Package flow is the checkout workflow's code: what a checkout does next,
// decided from its history (sdk.Decide).
//
//	reserve ─┬─ payment_confirmed ─→ render ┬→ send → completed
//	         │                      count  ┘
//	         └─ payment_timeout or cancel ─→ release → cancelled
//
// The first decision reserves the seats (reserve_seats, this plugin's) and
// sets the payment_timeout timer. Whichever comes first of the
// payment_confirmed signal, the timer and a cancel request decides the
// checkout:
//
//   - paid: once the reserve ended, render the tickets (render_tickets,
//     with SendSeparately) and count the sale (update_sales_counter) at
//     once; when both ended (fan-in: all), send the tickets
//     (send_tickets); when the send ended, complete. Those kinds are the
//     tickets' and counters plugins': the checkout's manifest lists them
//     in its enqueues, the grant rule under which the host lets a
//     decision schedule another plugin's kind;
//   - timed out or cancelled: once the reserve ended, release the seats
//     (release_seats, the compensation, one step, so once), then end
//     cancelled, with the cause in the result.
//
// A cancel asked after the payment came is recorded and ignored: the sale
// stands and the checkout completes (its result says so). A payment that
// comes after the timeout or the cancel, while the seats are released,
// changes nothing: the checkout ends cancelled, its result naming the
// payment (late_payment) for the application to refund. A step that
// dead-letters fails the checkout with the step's reason.
package flow

import (
	"context"
	"fmt"
	"time"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// Step ids and the timer's name, as the history names them.
const (
	StepReserve = "reserve"
	StepRelease = "release"
	StepRender  = "render"
	StepCount   = "count"
	StepSend    = "send"
	// TimerPayment is the payment's deadline.
	TimerPayment = "payment_timeout"
)

// Causes of a cancelled checkout, in its result.
const (
	CauseTimeout = "payment_timeout"
	CauseCancel  = "cancel_requested"
)

// Result is a checkout's result: completed (Payment set) or cancelled
// (Cause set; the seats were released).
type Result struct {
	OrderID int64  `json:"order_id"`
	Payment string `json:"payment,omitempty"`
	// CancelIgnored is the reason of a cancel asked after the payment.
	CancelIgnored string `json:"cancel_ignored,omitempty"`
	Cause         string `json:"cause,omitempty"`
	Reason        string `json:"reason,omitempty"`
	Released      bool   `json:"released,omitempty"`
	// NeverHeld: the cancel came before the reserve started, which was
	// cancelled with it (it never ran), so there was nothing to release.
	NeverHeld bool `json:"never_held,omitempty"`
	// LatePayment is the signal id of a payment that came after the
	// timeout or the cancel, while the seats were being released: the
	// workflow was still running, so the signal (and the application's
	// payment with it) was accepted, and the application must refund it.
	LatePayment string `json:"late_payment,omitempty"`
}

// outcome is what decided the checkout: the first of the payment, the
// timer and the cancel request in the history.
type outcome struct {
	paid, timedOut, cancelled bool
	payment, reason           string
}

func decided(h sdk.WorkflowHistory[stagedoor.Checkout]) outcome {
	for _, e := range h.Events {
		switch {
		case e.Type == sdk.EventSignalReceived && e.Name == stagedoor.PaymentConfirmed:
			return outcome{paid: true, payment: e.Detail}
		case e.Type == sdk.EventTimerFired && e.Name == TimerPayment:
			return outcome{timedOut: true}
		case e.Type == sdk.EventCancelRequested:
			return outcome{cancelled: true, reason: e.Detail}
		}
	}
	return outcome{}
}

// PayWithin is the checkout's hold on its seats.
func PayWithin(in stagedoor.Checkout) time.Duration {
	ms := in.PayWithinMS
	if ms <= 0 {
		ms = stagedoor.DefaultPayWithinMS
	}
	return time.Duration(ms) * time.Millisecond
}

// Decide is the checkout workflow type's code.
func Decide(_ context.Context, h sdk.WorkflowHistory[stagedoor.Checkout]) (sdk.Decision, error) {
	order := h.Input.OrderID
	if order <= 0 {
		return sdk.Fail(fmt.Sprintf("checkout %s: its input names no order", h.ID)), nil
	}
	wait := sdk.Decision{}
	reserve := h.Step(StepReserve)
	if !reserve.Scheduled {
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step(StepReserve, stagedoor.ReserveSeats{OrderID: order})},
			Timers: []sdk.Timer{{Name: TimerPayment, After: PayWithin(h.Input)}}}, nil
	}
	if reserve.Failed {
		return sdk.Fail("reserve_seats failed: " + reserve.Error), nil
	}
	o := decided(h)
	if reserve.Cancelled { // a cancel asked before the reserve started: nothing held, nothing to release
		r := Result{OrderID: order, Cause: CauseCancel, NeverHeld: true}
		r.Reason, _ = h.CancelRequested()
		if paid := h.Signals(stagedoor.PaymentConfirmed); len(paid) > 0 {
			r.LatePayment = paid[0].ID
		}
		return sdk.Cancelled(r), nil
	}
	if !o.paid && !o.timedOut && !o.cancelled || !reserve.Done() {
		return wait, nil // waiting for the payment, or for the reserve to end
	}
	if !o.paid { // the compensation
		release := h.Step(StepRelease)
		switch {
		case !release.Scheduled:
			// Detached: a cancel asked while the compensation waits to
			// start (after the timeout) does not cancel it.
			return sdk.Decision{Steps: []sdk.StepCall{sdk.Step(StepRelease, stagedoor.ReleaseSeats{OrderID: order}).Detached()}}, nil
		case release.Failed:
			return sdk.Fail("release_seats failed, the seats are still held: " + release.Error), nil
		case !release.Done():
			return wait, nil
		}
		r := Result{OrderID: order, Cause: CauseTimeout, Released: true}
		if o.cancelled {
			r.Cause, r.Reason = CauseCancel, o.reason
		}
		if late := h.Signals(stagedoor.PaymentConfirmed); len(late) > 0 {
			r.LatePayment = late[0].ID
		}
		return sdk.Cancelled(r), nil
	}
	render, count, send := h.Step(StepRender), h.Step(StepCount), h.Step(StepSend)
	switch {
	case !render.Scheduled:
		// Detached, like the send: a cancel asked after the payment is
		// ignored, so it cancels none of the sale's steps.
		return sdk.Decision{Steps: []sdk.StepCall{
			sdk.Step(StepRender, stagedoor.RenderTickets{OrderID: order, SendSeparately: true}).Detached(),
			sdk.Step(StepCount, stagedoor.UpdateSalesCounter{OrderID: order}).Detached()}}, nil
	case render.Failed:
		return sdk.Fail("render_tickets failed: " + render.Error), nil
	case count.Failed:
		return sdk.Fail("update_sales_counter failed: " + count.Error), nil
	case !render.Done() || !count.Done():
		return wait, nil // fan-in: both
	case !send.Scheduled:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step(StepSend, stagedoor.SendTickets{OrderID: order}).Detached()}}, nil
	case send.Failed:
		return sdk.Fail("send_tickets failed: " + send.Error), nil
	case !send.Done():
		return wait, nil
	}
	r := Result{OrderID: order, Payment: o.payment}
	if reason, ok := h.CancelRequested(); ok {
		r.CancelIgnored = "asked after the payment: " + reason
	}
	return sdk.Complete(r), nil
}

// Accept is how a version takes over a running checkout from another
// (`host workflows migrate`, sdk.AcceptMigration): every event of its
// history must be one this code decides from; a history with an event it
// does not know stays on the version that wrote it.
func Accept(_ context.Context, h sdk.WorkflowHistory[stagedoor.Checkout], from string) error {
	for _, e := range h.Events {
		switch e.Type {
		case sdk.EventStarted, sdk.EventStepScheduled, sdk.EventStepCompleted, sdk.EventStepFailed, sdk.EventStepCancelled, sdk.EventTimerSet,
			sdk.EventTimerFired, sdk.EventSignalReceived, sdk.EventCancelRequested, sdk.EventMigrated:
		default:
			return fmt.Errorf("checkout %s from %s has a %s event (#%d), which this version does not decide from", h.ID, from, e.Type, e.Seq)
		}
	}
	return nil
}

package sdktest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

// Credit is a workflow step: it credits customer 7's wallet.
type Credit struct {
	Amount int64 `json:"amount"`
}

func (Credit) Kind() string { return "credit_wallet" }

// credit records its job id with the credit (guard 4): each step's credit
// lands once, however often its job runs.
type credit struct{}

func (credit) Apply(ctx context.Context, job sdk.Job[Credit], tx *sdk.Tx) error {
	tx.Queue(sdk.Statement{SQL: `UPDATE wallets SET balance = balance + $1 WHERE customer = 7`, Args: []any{job.Args.Amount}})
	return sdk.StepResult(ctx, tx, job, map[string]int64{"credited": job.Args.Amount})
}

func recordCredit(p *sdk.Plugin) { sdk.HandleRecordJobID(p, credit{}) }

// Onboard is the workflow's input.
type Onboard struct {
	Welcome, Approved int64
}

// onboard credits a welcome bonus, then waits up to a day for the
// "approved" signal: approved, it credits the approval bonus and
// completes; not, it completes as expired. A cancel compensates nothing
// (the welcome bonus stays).
func onboard(_ context.Context, h sdk.WorkflowHistory[Onboard]) (sdk.Decision, error) {
	welcome, approved := h.Step("welcome"), h.Step("approved")
	if !welcome.Scheduled {
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("welcome", Credit{Amount: h.Input.Welcome})},
			Timers: []sdk.Timer{{Name: "deadline", After: 24 * time.Hour}}}, nil
	}
	if reason, ok := h.CancelRequested(); ok && !approved.Scheduled {
		if !welcome.Done() {
			return sdk.Decision{}, nil
		}
		return sdk.Cancelled(map[string]string{"reason": reason}), nil
	}
	switch {
	case !welcome.Done():
		return sdk.Decision{}, nil
	case approved.Completed:
		return sdk.Complete(map[string]any{"approved": true, "credited": string(approved.Result)}), nil
	case approved.Scheduled:
		return sdk.Decision{}, nil
	case len(h.Signals("approved")) > 0:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("approved", Credit{Amount: h.Input.Approved})}}, nil
	case h.TimerFired("deadline"):
		return sdk.Complete(map[string]any{"approved": false}), nil
	}
	return sdk.Decision{}, nil
}

// onboardFlow is the onboarding workflow; want is the balance it must
// leave.
func onboardFlow(tb testing.TB, register func(*sdk.Plugin), wait func(sdktest.Waiting) []sdktest.Send, want int64) sdktest.Flow[Onboard] {
	hosttest.EnsureRoles(tb, "onboard")
	return sdktest.Flow[Onboard]{
		Plugin: "onboard", Schema: schema + `GRANT SELECT, UPDATE ON wallets TO ` + hosttest.PluginRole("onboard"),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.FlowSetup[Onboard] {
			p := sdk.New("onboard", "1")
			register(p)
			sdk.HandleWorkflow(p, "onboard", onboard)
			return sdktest.FlowSetup[Onboard]{Plugin: p, Type: "onboard", ID: "customer-7", Input: Onboard{Welcome: 10, Approved: 100},
				Wait: wait,
				Effects: func(ctx context.Context) (any, error) {
					var balance int64
					err := pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE customer = 7`).Scan(&balance)
					return balance, err
				},
				Want: want}
		},
	}
}

// approveOnce sends the approval once the welcome bonus is credited.
func approveOnce(w sdktest.Waiting) []sdktest.Send {
	for _, e := range w.Events {
		if e.Type == sdk.EventSignalReceived {
			return nil
		}
	}
	for _, e := range w.Events {
		if e.Type == sdk.EventStepCompleted && e.Name == "welcome" {
			return []sdktest.Send{{Signal: "approved", SignalID: "ok-1", Payload: map[string]string{"by": "ops"}}}
		}
	}
	return nil
}

// The kit drives a workflow end to end through the host's decider and
// guard runner: a step, a signal the test sends when the workflow waits,
// a second step that uses nothing of the first, the result; then every
// scenario (steps and tasks run twice, crashed at every point and
// redelivered) ends the same, with each credit once.
func TestFlowKitProvesAWorkflow(t *testing.T) {
	t.Parallel()
	run := sdktest.RunFlow(t, onboardFlow(t, recordCredit, approveOnce, 110))
	require.Equal(t, "completed", run.State)
	require.JSONEq(t, `{"approved": true, "credited": "{\"credited\": 100}"}`, string(run.Result))
	require.Equal(t, int64(110), run.Effects)
	require.Equal(t, map[string]int{"welcome": 1, "approved": 1}, run.Runs)
	require.Equal(t, 4, run.Decisions, "start, welcome done, signal, approved done")
}

// With nothing sent, the clock skips the day to the deadline: the timer
// fires at once and the workflow expires, having credited the welcome
// bonus only.
func TestFlowKitSkipsTimeToTheTimer(t *testing.T) {
	t.Parallel()
	failures, run := sdktest.CheckFlow(t, onboardFlow(t, recordCredit, nil, 10))
	require.Empty(t, failures)
	require.Equal(t, "completed", run.State)
	require.JSONEq(t, `{"approved": false}`, string(run.Result))
	require.Equal(t, int64(10), run.Effects)
	var fired bool
	for _, e := range run.Events {
		fired = fired || e.Type == sdk.EventTimerFired && e.Name == "deadline"
	}
	require.True(t, fired, "the deadline fired")
}

// A cancel the test sends: the workflow ends cancelled after its step.
func TestFlowKitSendsACancel(t *testing.T) {
	t.Parallel()
	cancel := func(w sdktest.Waiting) []sdktest.Send {
		if w.Waits == 0 {
			return []sdktest.Send{{Cancel: true, Reason: "closed the account"}}
		}
		return nil
	}
	failures, run := sdktest.CheckFlow(t, onboardFlow(t, recordCredit, cancel, 10))
	require.Empty(t, failures)
	require.Equal(t, "cancelled", run.State)
	require.JSONEq(t, `{"reason": "closed the account"}`, string(run.Result))
	require.Equal(t, int64(10), run.Effects)
}

// twiceCredit is a state-first step whose "conditional" write is always
// true: a redelivered step credits again. The kit must catch it.
type twiceCredit struct{}

func (twiceCredit) Check(ctx context.Context, job sdk.Job[Credit], db *sdk.ReadOnly) (struct{}, bool, error) {
	return struct{}{}, false, nil
}

func (twiceCredit) Prepare(ctx context.Context, job sdk.Job[Credit], s struct{}) (struct{}, error) {
	return s, nil
}

func (twiceCredit) Commit(ctx context.Context, job sdk.Job[Credit], tx *sdk.CommitTx, s struct{}) error {
	_, err := tx.WriteIf(ctx, `UPDATE wallets SET balance = balance + $1 WHERE customer = 7 RETURNING customer`, job.Args.Amount)
	return err
}

// The kit fails a workflow whose step is not exactly-once, naming the
// scenario and both balances.
func TestFlowKitCatchesADoubledStep(t *testing.T) {
	t.Parallel()
	failures, run := sdktest.CheckFlow(t, onboardFlow(t, func(p *sdk.Plugin) { sdk.HandleStateFirst(p, twiceCredit{}) }, approveOnce, 110))
	require.Equal(t, int64(110), run.Effects, "a single clean run credits each step once")
	require.NotEmpty(t, failures, "the kit let a step that credits on every run pass")
	all := strings.Join(failures, "\n")
	require.Contains(t, all, "onboard workflow is not exactly-once when every step runs twice")
	require.Contains(t, all, "want:     110\n  this run: 220")
	require.Len(t, failures, 1, "a crash rolls the always-true write back: only the redelivery of a finished step doubles it")
}

// creditNothing answers as credit does and credits nothing.
type creditNothing struct{}

func (creditNothing) Apply(ctx context.Context, job sdk.Job[Credit], tx *sdk.Tx) error {
	return sdk.StepResult(ctx, tx, job, map[string]int64{"credited": job.Args.Amount})
}

// A workflow states its effects as a Case does: a step that does nothing
// fails the clean run (before FlowSetup.Want it passed every scenario),
// and a FlowSetup that states none is refused.
func TestFlowKitFailsAStepThatDoesNothing(t *testing.T) {
	t.Parallel()
	failures, run := sdktest.CheckFlow(t, onboardFlow(t, func(p *sdk.Plugin) { sdk.HandleRecordJobID(p, creditNothing{}) }, approveOnce, 110))
	require.Equal(t, "completed", run.State, "the workflow itself ends as the right one does")
	require.Len(t, failures, 1)
	require.Contains(t, failures[0], "onboard workflow: a single clean run left other effects than the test states (FlowSetup.Want)")
	require.Contains(t, failures[0], "want:     110\n  this run: 0")

	f := onboardFlow(t, recordCredit, approveOnce, 110)
	start := f.Start
	f.Start = func(tb testing.TB, pool *pgxpool.Pool) sdktest.FlowSetup[Onboard] {
		s := start(tb, pool)
		s.Want = nil
		return s
	}
	failures, _ = sdktest.CheckFlow(t, f)
	require.Len(t, failures, 1)
	require.Contains(t, failures[0], "FlowSetup.Want is not set")
}

// Package badplugin commits each mistake usher-vet reports, beside the
// clean cases it must not report. Each reported line carries a want
// comment.
package badplugin

import (
	"context"
	"net/http"
	"os"
	"os/exec"

	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/audit"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/mailer"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/store"
)

// Order is the job payload.
type Order struct{ ID int64 }

// Kind implements sdk.Args.
func (Order) Kind() string { return "order" }

// State is what a state-first handler carries between phases.
type State struct{ Key string }

// Render is the clean state-first handler: it stores under a key derived
// from the order in Prepare, and commits conditionally.
type Render struct{ Store store.Dir }

func (r *Render) Check(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly) (State, bool, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM tickets WHERE order_id = $1 AND pdf_key IS NULL`, job.Args.ID).Scan(&n)
	f, _ := os.OpenFile("/etc/hostname", os.O_RDONLY, 0) // reading is no effect
	if f != nil {
		_ = f.Close()
	}
	return State{}, n == 0, err
}

func (r *Render) Prepare(ctx context.Context, job sdk.Job[Order], st State) (State, error) { // want Prepare:`keyed: effect idempotent by key \(store.Dir\).Put -> //usher:idempotent-by-key`
	st.Key = "tickets/order.pdf"
	return st, r.Store.Put(ctx, st.Key, []byte("%PDF"))
}

func (r *Render) Commit(ctx context.Context, job sdk.Job[Order], tx *sdk.CommitTx, st State) error {
	_, err := tx.WriteIf(ctx, `UPDATE tickets SET pdf_key = $1 WHERE order_id = $2 AND pdf_key IS NULL RETURNING id`, st.Key, job.Args.ID)
	testHook()
	return err
}

// testHook writes a marker file, declared no effect of the job.
//
//usher:no-effect test hook
func testHook() { _ = os.WriteFile("/tmp/hook", nil, 0o600) }

// CheckSendMark is the anti-pattern: check, send in Prepare, mark in Commit.
type CheckSendMark struct {
	Mailer *mailer.Client
	Store  store.Dir
}

func (h *CheckSendMark) Check(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly) (State, bool, error) { // want Check:`effect: marked effect badplugin.notify -> //usher:effect`
	notify(job.Args.ID)                     // want `CheckSendMark.Check: marked effect outside the effect phase: badplugin.notify`
	out, _ := exec.Command("true").Output() // want `CheckSendMark.Check: process start outside the effect phase: \(\*exec.Cmd\).Output`
	_ = out
	f, _ := os.OpenFile("/tmp/x", os.O_RDWR, 0) // want `CheckSendMark.Check: file write outside the effect phase: os.OpenFile`
	_ = f
	return State{}, false, nil
}

func (h *CheckSendMark) Prepare(ctx context.Context, job sdk.Job[Order], st State) (State, error) { // want Prepare:`effect: network call`
	return st, h.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil) // want `CheckSendMark.Prepare: network call outside the effect phase: \(\*mailer.Client\).Send -> sdk.NewProviderRequest \(only a call declared //usher:idempotent-by-key`
}

func (h *CheckSendMark) Commit(ctx context.Context, job sdk.Job[Order], tx *sdk.CommitTx, st State) error { // want Commit:`effect: network call .*; keyed: `
	if err := h.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil); err != nil { // want `CheckSendMark.Commit: network call outside the effect phase`
		return err
	}
	audit.Record("sent") // want `CheckSendMark.Commit: marked effect outside the effect phase: audit.Record`
	_, err := tx.WriteIf(ctx, `UPDATE orders SET sent_at = now() WHERE id = $1 AND sent_at IS NULL RETURNING id`, job.Args.ID)
	if err != nil {
		return err
	}
	return h.Store.Put(ctx, "k", nil) // want `CheckSendMark.Commit: effect idempotent by key outside the effect phase: \(store.Dir\).Put -> //usher:idempotent-by-key \(an effect idempotent by key belongs in Prepare`
}

// notify tells a chat channel; the author marks it an effect.
//
//usher:effect
func notify(id int64) {} // want notify:`effect: marked effect //usher:effect`

// SendFromApply sends from a job-id-recorded handler, which protects
// database effects only.
type SendFromApply struct{ Mailer *mailer.Client }

func (h SendFromApply) Apply(ctx context.Context, job sdk.Job[Order], tx *sdk.Tx) error { // want Apply:`effect: network call`
	announce(ctx) // want `SendFromApply.Apply: network call outside the effect phase: badplugin.announce -> badplugin.post -> http.Post`
	go func() {
		_, _ = http.Get("http://stats.invalid/") // want `SendFromApply.Apply: network call outside the effect phase: http.Get`
	}()
	return h.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil) // want `SendFromApply.Apply: network call outside the effect phase: \(\*mailer.Client\).Send`
}

// announce reaches the network through a helper of the same package.
func announce(ctx context.Context) { post() } // want announce:`effect: network call badplugin.post -> http.Post`

func post() { _, _ = http.Post("http://hooks.invalid/", "text/plain", nil) } // want post:`effect: network call http.Post`

// Send is the clean claim effect: it sends with the key it receives.
type Send struct{ Mailer *mailer.Client }

func (s *Send) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Key: []sdk.Column{{Name: "order_id", Value: job.Args.ID}}, Intent: "order-1"}, nil
}

func (s *Send) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want Effect:`effect: network call` Effect:`key reaches \(\*mailer.Client\).Send -> sdk.NewProviderRequest from parameters \[4\]`
	return s.Mailer.Send(ctx, key, nil)
}

// BlankKey throws its key away and makes one up.
type BlankKey struct{ Mailer *mailer.Client }

func (s BlankKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) { // want Claim:`effect: marked effect audit.Record`
	audit.Record("claimed") // want `BlankKey.Claim: marked effect outside the effect phase: audit.Record -> //usher:effect`
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s BlankKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, _ sdk.IdempotencyKey) error { // want `BlankKey.Effect ignores its idempotency key` Effect:`effect: network call`
	return s.Mailer.Send(ctx, sdk.KeyForTest("order-1"), nil) // want `sdk.KeyForTest outside a _test.go file`
}

// UnusedKey names its key and sends without it.
type UnusedKey struct{ Mailer *mailer.Client }

func (s *UnusedKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *UnusedKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want `UnusedKey.Effect never uses its idempotency key key` Effect:`effect: network call`
	return s.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil)
}

// Generic is a handler over any payload; its type parameter is the
// guard's type argument.
type Generic[T sdk.Args] struct{ Dir string }

func (g *Generic[T]) Apply(ctx context.Context, job sdk.Job[T], tx *sdk.Tx) error { // want Apply:`effect: file write os.Create`
	f, err := os.Create(g.Dir + "/" + job.ID) // want `Generic.Apply: file write outside the effect phase: os.Create`
	if err != nil {
		return err
	}
	return f.Close()
}

// NotAHandler has an Apply of another shape: nothing is checked.
type NotAHandler struct{}

func (NotAHandler) Apply(ctx context.Context) error { return os.WriteFile("/tmp/x", nil, 0o600) } // want Apply:`effect: file write`

var (
	_ sdk.StateFirst[Order, State] = (*Render)(nil)
	_ sdk.StateFirst[Order, State] = (*CheckSendMark)(nil)
	_ sdk.RecordJobID[Order]       = SendFromApply{}
	_ sdk.ClaimEffect[Order]       = (*Send)(nil)
	_ sdk.ClaimEffect[Order]       = BlankKey{}
	_ sdk.ClaimEffect[Order]       = (*UnusedKey)(nil)
	_ sdk.RecordJobID[Order]       = (*Generic[Order])(nil)
)

// typo misspells a directive.
//
//usher:efect // want `unknown directive //usher:efect`
func typo() {}

// Notify is a middleware that sends: it runs in every phase, so its send
// is outside the effect phase wherever it wraps.
type Notify struct{ Mailer *mailer.Client }

func (n Notify) Wrap(ctx context.Context, call *sdk.Call, next func(context.Context) error) error { // want Wrap:`effect: network call`
	if err := n.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil); err != nil { // want `Notify.Wrap: network call outside the effect phase: .* \(a middleware runs in every phase`
		return err
	}
	return next(ctx)
}

// Hooked is a clean middleware: its marker file is declared no effect.
type Hooked struct{}

func (Hooked) Wrap(ctx context.Context, call *sdk.Call, next func(context.Context) error) error {
	testHook()
	return next(ctx)
}

var (
	_ sdk.Middleware = Notify{}
	_ sdk.Middleware = Hooked{}
	// A function literal as middleware is checked too.
	_ = sdk.MiddlewareFunc(func(ctx context.Context, call *sdk.Call, next func(context.Context) error) error {
		_ = os.WriteFile("/tmp/timing", nil, 0o600) // want `sdk.MiddlewareFunc: file write outside the effect phase: os.WriteFile \(a middleware runs`
		return next(ctx)
	})
)

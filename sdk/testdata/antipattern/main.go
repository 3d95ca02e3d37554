// Command antipattern is the handler the reference text warns about,
// written against the SDK: read sent_at IS NULL in one place, send, write
// sent_at in another. It must not compile; sdk's tests build it and check
// each line below is refused.
package main

import (
	"context"

	"github.com/usherhq/usher/sdk"
)

type args struct{ OrderID int64 }

func (args) Kind() string { return "send_tickets_wrong" }

type state struct{}

type wrong struct{}

func (wrong) Check(ctx context.Context, job sdk.Job[args], db *sdk.ReadOnly) (state, bool, error) {
	// ANTI-1: a write in the check phase.
	_, err := db.Exec(ctx, `UPDATE email_sends SET sent_at = now() WHERE order_id = $1`, job.Args.OrderID)
	return state{}, false, err
}

func (wrong) Prepare(ctx context.Context, job sdk.Job[args], s state) (state, error) { return s, nil }

func (wrong) Commit(ctx context.Context, job sdk.Job[args], tx *sdk.CommitTx, s state) error {
	// ANTI-2: a plain write with no conditional write.
	if _, err := tx.Exec(ctx, `UPDATE email_sends SET sent_at = now()`); err != nil {
		return err
	}
	// ANTI-3: a follow-on job without a won write.
	return tx.Enqueue(ctx, args{})
}

type wrongSend struct{}

func (wrongSend) Claim(job sdk.Job[args]) (sdk.Claim, error) { return sdk.Claim{}, nil }

func (wrongSend) Effect(ctx context.Context, job sdk.Job[args], db *sdk.ReadOnly, key sdk.IdempotencyKey) error {
	// ANTI-4: the effect marks itself done, in another transaction.
	_, err := db.Exec(ctx, `UPDATE email_sends SET sent_at = now()`)
	return err
}

func main() {
	p := sdk.New("wrong", "0")
	sdk.HandleStateFirst[args, state](p, wrong{})
	sdk.HandleClaim[args](p, wrongSend{})
	// ANTI-5: a key minted per attempt instead of derived from the intent.
	_ = sdk.IdempotencyKey{value: "attempt-1"}
	// ANTI-6: a handler registered without a guard.
	sdk.Handle(p, wrong{})
	sdk.Serve(p)
}

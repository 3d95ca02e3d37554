package sdk_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/usherhq/usher/sdk"
)

// LoyaltyPoints is a third party's job: credit an order's loyalty points.
type LoyaltyPoints struct {
	OrderID int64 `json:"order_id"`
	Points  int   `json:"points"`
}

func (LoyaltyPoints) Kind() string { return "credit_loyalty_points" }

// credit has no state to read (a balance credited twice looks like a larger
// credit), so it records the job id in the transaction of its write.
type credit struct{}

func (credit) Apply(ctx context.Context, job sdk.Job[LoyaltyPoints], tx *sdk.Tx) error {
	// Queued: it runs in the job's transaction after Apply returns, with
	// no round trip; no such order fails the job permanently.
	tx.Queue(sdk.Statement{
		SQL:     `UPDATE loyalty SET points = points + $1 WHERE order_id = $2`,
		Args:    []any{job.Args.Points, job.Args.OrderID},
		MinRows: 1, Missing: fmt.Sprintf("no loyalty account for order %d", job.Args.OrderID),
	})
	return nil
}

// Invoice is a job with a state to reach: an order's invoice number.
type Invoice struct {
	OrderID int64 `json:"order_id"`
}

func (Invoice) Kind() string { return "number_invoice" }

// invoice checks whether the order already has its number, computes one
// with no database handle, and stores it only where none is stored yet.
type invoice struct{}

func (invoice) Check(ctx context.Context, job sdk.Job[Invoice], db *sdk.ReadOnly) (string, bool, error) {
	var number *string
	if err := db.QueryRow(ctx, `SELECT invoice_number FROM orders WHERE id = $1`, job.Args.OrderID).Scan(&number); err != nil {
		return "", false, err
	}
	return "", number != nil, nil // done when the number is there
}

func (invoice) Prepare(ctx context.Context, job sdk.Job[Invoice], _ string) (string, error) {
	return fmt.Sprintf("INV-%08d", job.Args.OrderID), nil // slow work goes here
}

func (invoice) Commit(ctx context.Context, job sdk.Job[Invoice], tx *sdk.CommitTx, number string) error {
	win, err := tx.WriteIf(ctx, `UPDATE orders SET invoice_number = $1 WHERE id = $2 AND invoice_number IS NULL`, number, job.Args.OrderID)
	if err != nil || win == nil {
		return err // nil win: another run stored it first; nothing more to do
	}
	return win.Enqueue(ctx, Receipt(job.Args))
}

// Receipt is a job whose effect leaves the process: a receipt email.
type Receipt struct {
	OrderID int64 `json:"order_id"`
}

func (Receipt) Kind() string { return "send_receipt" }

type receipt struct{}

// Claim declares the row that decides which run owns the send; the intent
// becomes the provider's idempotency key.
func (receipt) Claim(job sdk.Job[Receipt]) (sdk.Claim, error) {
	return sdk.Claim{
		Table:  "receipt_sends",
		Key:    []sdk.Column{{Name: "order_id", Value: job.Args.OrderID}},
		Intent: "receipt-" + strconv.FormatInt(job.Args.OrderID, 10),
		Result: []string{"provider_message_id"},
	}, nil
}

func (receipt) Effect(ctx context.Context, job sdk.Job[Receipt], db *sdk.ReadOnly, key sdk.IdempotencyKey) error {
	req, err := sdk.NewProviderRequest(ctx, "POST", "https://mail.example/v1/messages", []byte(`{}`), key)
	if err != nil {
		return err
	}
	_ = req // send it with your HTTP client; a 4xx is sdk.Permanent, a 5xx a plain error
	// Keep what the provider answered: written with the mark.
	return sdk.KeepResult(ctx, "msg-from-the-provider's-answer")
}

// A third-party plugin's whole main: register each kind through its guard,
// then Serve.
func Example() {
	p := sdk.New("loyalty", "1.2.0")
	sdk.HandleRecordJobID[LoyaltyPoints](p, credit{})
	sdk.HandleClaim[Receipt](p, receipt{})
	sdk.HandleStateFirst[Invoice](p, invoice{})
	fmt.Println(p.Kinds(), p.Err())
	// In main: sdk.Serve(p)

	// Output: [credit_loyalty_points number_invoice send_receipt] <nil>
}

// A build of a plugin for tests or chaos wraps its handlers from outside:
// here, every phase of every kind logs how long it took and how it ended.
// The handlers are the shipped ones, unchanged; the middleware gets each
// phase's capability and nothing more (a read-only handle in Check, no
// database in Prepare), and the host checks what it does as it checks a
// handler.
func ExampleUse() {
	p := sdk.New("loyalty", "1.2.0")
	sdk.HandleRecordJobID[LoyaltyPoints](p, credit{})
	sdk.HandleStateFirst[Invoice](p, invoice{})
	sdk.Use(p, sdk.MiddlewareFunc(func(ctx context.Context, call *sdk.Call, next func(context.Context) error) error {
		start := time.Now()
		err := next(ctx)
		call.Log.Info("phase ran", "kind", call.Kind, "phase", call.Phase, "job_id", call.JobID,
			"took", time.Since(start), "err", err)
		return err
	}))
	fmt.Println(p.Kinds(), p.Err())
	// In main: sdk.Serve(p)

	// Output: [credit_loyalty_points number_invoice] <nil>
}

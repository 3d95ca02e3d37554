package sdk_test

import (
	"context"
	"fmt"
	"strconv"

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
	_, err := tx.Exec(ctx, `UPDATE loyalty SET points = points + $1 WHERE order_id = $2`, job.Args.Points, job.Args.OrderID)
	return err
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
	}, nil
}

func (receipt) Effect(ctx context.Context, job sdk.Job[Receipt], db *sdk.ReadOnly, key sdk.IdempotencyKey) error {
	req, err := sdk.NewProviderRequest(ctx, "POST", "https://mail.example/v1/messages", []byte(`{}`), key)
	if err != nil {
		return err
	}
	_ = req // send it with your HTTP client; a 4xx is sdk.Permanent, a 5xx a plain error
	return nil
}

// A third-party plugin's whole main: register each kind through its guard,
// then Serve.
func Example() {
	p := sdk.New("loyalty", "1.2.0")
	sdk.HandleRecordJobID[LoyaltyPoints](p, credit{})
	sdk.HandleClaim[Receipt](p, receipt{})
	fmt.Println(p.Kinds(), p.Err())
	// In main: sdk.Serve(p)

	// Output: [credit_loyalty_points send_receipt] <nil>
}

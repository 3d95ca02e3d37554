package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/usherhq/usher/sdk"
)

// Refund asks for one refund at the payment provider. RefundID is the
// application's id for this refund request: the same request enqueued
// twice is one refund.
type Refund struct {
	RefundID    string `json:"refund_id"`
	PaymentID   string `json:"payment_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// Kind is called on the zero value.
func (Refund) Kind() string { return "refund" }

// refund moves money outside the process, and there is no state to read
// first that would say whether the provider already did it. So: a claim
// row (refund_claims, unique on refund_id) decides which run may call the
// provider, and the provider's idempotency key, derived from the refund's
// intent, closes the window between the provider's answer and the mark.
type refund struct {
	provider string
	client   *http.Client
	lease    time.Duration
}

var _ sdk.ClaimEffect[Refund] = refund{}

func (r refund) Claim(job sdk.Job[Refund]) (sdk.Claim, error) {
	if job.Args.RefundID == "" || job.Args.PaymentID == "" || job.Args.AmountCents <= 0 || job.Args.Currency == "" {
		return sdk.Claim{}, sdk.Permanent(fmt.Errorf("refund needs refund_id, payment_id, a positive amount_cents and currency, got %+v", job.Args))
	}
	return sdk.Claim{
		Table:  "refund_claims",
		Key:    []sdk.Column{{Name: "refund_id", Value: job.Args.RefundID}},
		Lease:  r.lease,
		Intent: "refund-" + job.Args.RefundID,
		// The provider's refund id, written with the mark.
		Result: []string{"provider_refund_id"},
	}, nil
}

// refundAnswer is what the provider answers a refund.
type refundAnswer struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

func (r refund) Effect(ctx context.Context, job sdk.Job[Refund], _ *sdk.ReadOnly, key sdk.IdempotencyKey) error {
	if r.provider == "" {
		return errors.New("REFUNDS_PROVIDER_URL is not set: pass it with host run --plugin-env REFUNDS_PROVIDER_URL=URL")
	}
	body, err := json.Marshal(map[string]any{
		"payment_id": job.Args.PaymentID, "amount_cents": job.Args.AmountCents, "currency": job.Args.Currency,
	})
	if err != nil {
		return sdk.Permanent(err)
	}
	req, err := sdk.NewProviderRequest(ctx, http.MethodPost, r.provider+"/v1/refunds", body, key)
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("refund %s: provider: %w", job.Args.RefundID, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 500:
		return fmt.Errorf("refund %s: provider answered %s: %s", job.Args.RefundID, resp.Status, raw)
	case resp.StatusCode >= 400:
		// Refused (already refunded in full, unknown payment, the key
		// reused with another amount): asking again would not help.
		return sdk.Permanent(fmt.Errorf("refund %s: provider refused: %s: %s", job.Args.RefundID, resp.Status, raw))
	}
	var answer refundAnswer
	if err := json.Unmarshal(raw, &answer); err != nil || answer.ID == "" {
		return sdk.Permanent(fmt.Errorf("refund %s: provider answered %s without a refund id: %s", job.Args.RefundID, resp.Status, raw))
	}
	job.Log.Info("refunded", "refund_id", job.Args.RefundID, "provider_refund_id", answer.ID, "status", answer.Status)
	return sdk.KeepResult(ctx, answer.ID)
}

package main

import (
	"context"

	"github.com/usherhq/usher/sdk"
)

// Return is a product return's input: refund the payment, then credit the
// customer's wallet a goodwill amount.
type Return struct {
	Refund        Refund `json:"refund"`
	WalletID      int64  `json:"wallet_id"`
	GoodwillCents int64  `json:"goodwill_cents"`
}

// ReturnResult is a finished return's result.
type ReturnResult struct {
	RefundID string `json:"refund_id"`
	Credited int64  `json:"credited_cents,omitempty"`
	// Cancelled says why no refund was made: the return was cancelled
	// before its refund started (the host cancelled the step with it).
	Cancelled string `json:"cancelled,omitempty"`
}

// decideReturn is workflow type "return": each step is a job of this
// plugin's own kinds, with its own guard (the refund's claim and provider
// key, the credit's recorded job id), so each happens once however often
// a decision or a step is delivered. The goodwill credit is detached: once
// the money went back, a cancel asked later does not take the credit away.
// A decision decides from its history alone (usher-vet reports a clock,
// a database or an effect reached from here).
func decideReturn(_ context.Context, h sdk.WorkflowHistory[Return]) (sdk.Decision, error) {
	in := h.Input
	refund, credit := h.Step("refund"), h.Step("goodwill")
	switch {
	case !refund.Scheduled:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("refund", in.Refund)}}, nil
	case refund.Cancelled:
		reason, _ := h.CancelRequested()
		return sdk.Cancelled(ReturnResult{RefundID: in.Refund.RefundID, Cancelled: reason}), nil
	case refund.Failed:
		return sdk.Fail("the refund failed: " + refund.Error), nil
	case !refund.Done():
		return sdk.Decision{}, nil
	case in.GoodwillCents > 0 && !credit.Scheduled:
		return sdk.Decision{Steps: []sdk.StepCall{sdk.Step("goodwill",
			CreditWallet{WalletID: in.WalletID, AmountCents: in.GoodwillCents, Reason: "return " + in.Refund.RefundID}).Detached()}}, nil
	case credit.Failed:
		return sdk.Fail("the goodwill credit failed: " + credit.Error), nil
	case in.GoodwillCents > 0 && !credit.Done():
		return sdk.Decision{}, nil
	}
	return sdk.Complete(ReturnResult{RefundID: in.Refund.RefundID, Credited: in.GoodwillCents}), nil
}

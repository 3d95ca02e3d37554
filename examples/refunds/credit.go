package main

import (
	"context"
	"fmt"

	"github.com/usherhq/usher/sdk"
)

// CreditWallet adds AmountCents to a wallet's balance, with a ledger entry.
type CreditWallet struct {
	WalletID    int64  `json:"wallet_id"`
	AmountCents int64  `json:"amount_cents"`
	Reason      string `json:"reason"`
}

// Kind is called on the zero value.
func (CreditWallet) Kind() string { return "credit_wallet" }

// creditWallet's effects are database writes with no state to read: a
// balance credited twice looks like a larger credit. The host records the
// job's id in the same transaction as these writes, so a redelivered job
// never reaches Apply again.
type creditWallet struct{}

var _ sdk.RecordJobID[CreditWallet] = creditWallet{}

func (creditWallet) Apply(ctx context.Context, job sdk.Job[CreditWallet], tx *sdk.Tx) error {
	if job.Args.AmountCents <= 0 {
		return sdk.Permanent(fmt.Errorf("credit_wallet needs a positive amount_cents, got %d", job.Args.AmountCents))
	}
	// Queued: both run in the job's transaction after Apply returns. An
	// unknown wallet fails the job permanently and rolls both back.
	tx.Queue(
		sdk.Statement{
			SQL:     `UPDATE wallets SET balance_cents = balance_cents + $1 WHERE id = $2`,
			Args:    []any{job.Args.AmountCents, job.Args.WalletID},
			MinRows: 1, Missing: fmt.Sprintf("credit_wallet: no wallet %d", job.Args.WalletID),
		},
		sdk.Statement{
			SQL:  `INSERT INTO wallet_ledger (job_id, wallet_id, amount_cents, reason) VALUES ($1, $2, $3, $4)`,
			Args: []any{job.ID, job.Args.WalletID, job.Args.AmountCents, job.Args.Reason},
		})
	return nil
}

package handlers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/mail"
	"github.com/usherhq/usher/sdk"
)

// Send makes sure an order's ticket email has been sent, once.
type Send struct {
	Store  *blob.FS
	Mailer *mail.Client
	// Lease of the send claim; default sdk.DefaultLease (2 minutes).
	Lease time.Duration
}

var _ sdk.ClaimEffect[stagedoor.SendTickets] = (*Send)(nil)

// Claim declares the email_sends row; the intent names "the ticket email
// for order N", and the provider key is derived from it.
func (s *Send) Claim(job sdk.Job[stagedoor.SendTickets]) (sdk.Claim, error) {
	if job.Args.OrderID <= 0 {
		return sdk.Claim{}, sdk.Permanent(fmt.Errorf("send_tickets needs an order_id, got %d", job.Args.OrderID))
	}
	return sdk.Claim{
		Table:         "email_sends",
		Key:           []sdk.Column{{Name: "order_id", Value: job.Args.OrderID}, {Name: "kind", Value: "tickets"}},
		ClaimedColumn: "claimed_at",
		DoneColumn:    "sent_at",
		Lease:         s.Lease,
		Intent:        "tickets-" + strconv.FormatInt(job.Args.OrderID, 10),
		// The provider's message id, kept with the mark.
		Result: []string{"provider_message_id"},
	}, nil
}

// Effect sends the email with the rendered PDF's checksum as attachment.
func (s *Send) Effect(ctx context.Context, job sdk.Job[stagedoor.SendTickets], db *sdk.ReadOnly, key sdk.IdempotencyKey) error {
	var publicID, buyer, email, event string
	var pdfKey *string
	err := db.QueryRow(ctx, `
		SELECT o.public_id, o.buyer, o.email, e.name,
		       (SELECT min(pdf_key) FROM tickets t WHERE t.order_id = o.id)
		FROM orders o JOIN events e ON e.id = o.event_id WHERE o.id = $1`, job.Args.OrderID).
		Scan(&publicID, &buyer, &email, &event, &pdfKey)
	if errors.Is(err, sdk.ErrNoRows) {
		return sdk.Permanent(fmt.Errorf("order %d does not exist", job.Args.OrderID))
	}
	if err != nil {
		return err
	}
	if pdfKey == nil {
		return sdk.RetryLater(5*time.Second, "tickets are not rendered yet")
	}
	pdf, err := s.Store.Get(ctx, *pdfKey)
	if err != nil {
		return fmt.Errorf("read %s: %w", *pdfKey, err)
	}
	sum := sha256.Sum256(pdf)
	receipt, err := s.Mailer.Send(ctx, key, mail.Message{
		To:          email,
		Subject:     "Your tickets for " + event + " (" + publicID + ")",
		Text:        "Hello " + buyer + ", your tickets are attached.",
		Attachments: []mail.Attachment{{Name: publicID + ".pdf", SHA256: hex.EncodeToString(sum[:])}},
	})
	if err != nil {
		if errors.Is(err, mail.ErrRejected) {
			return sdk.Permanent(err)
		}
		return fmt.Errorf("send ticket email: %w", err)
	}
	job.Log.Info("ticket email sent", "order_id", job.Args.OrderID, "message_id", receipt.ID, "replayed", receipt.Replayed, "key", key.String())
	return sdk.KeepResult(ctx, receipt.ID)
}

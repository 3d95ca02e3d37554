// Package handlers holds the tickets plugin's handlers, separate from its
// main so the SDK test kit can drive them.
package handlers

import (
	"context"
	"fmt"
	"time"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/render"
	"github.com/usherhq/usher/sdk"
)

// Render makes sure an order's tickets are rendered and queued to send.
type Render struct {
	Store *blob.FS
}

// RenderState carries the order from check to prepare, and the stored PDF's
// key from prepare to commit.
type RenderState struct {
	Order  render.Order `json:"order"`
	PDFKey string       `json:"pdf_key,omitempty"`
}

var _ sdk.StateFirst[stagedoor.RenderTickets, RenderState] = (*Render)(nil)

// PDFKey is where an order's PDF is stored: derived from the order, so a
// second store overwrites identical bytes.
func PDFKey(publicID string) string { return "tickets/" + publicID + ".pdf" }

// Check reads the order; the state is reached when no ticket lacks a key.
func (r *Render) Check(ctx context.Context, job sdk.Job[stagedoor.RenderTickets], db *sdk.ReadOnly) (RenderState, bool, error) {
	var st RenderState
	o := &st.Order
	err := db.QueryRow(ctx, `
		SELECT o.id, o.public_id, e.name, e.venue, e.starts_at, o.buyer, o.email, o.created_at
		FROM orders o JOIN events e ON e.id = o.event_id WHERE o.id = $1`, job.Args.OrderID).
		Scan(&o.ID, &o.PublicID, &o.EventName, &o.Venue, &o.StartsAt, &o.Buyer, &o.Email, &o.CreatedAt)
	if err == sdk.ErrNoRows {
		return st, false, sdk.Permanent(fmt.Errorf("order %d does not exist", job.Args.OrderID))
	}
	if err != nil {
		return st, false, err
	}
	rows, err := db.Query(ctx, `SELECT id, code, seat, pdf_key IS NOT NULL FROM tickets WHERE order_id = $1 ORDER BY id`, job.Args.OrderID)
	if err != nil {
		return st, false, err
	}
	missing := 0
	for rows.Next() {
		var t render.Ticket
		var has bool
		if err := rows.Scan(&t.ID, &t.Code, &t.Seat, &has); err != nil {
			return st, false, err
		}
		if !has {
			missing++
		}
		o.Tickets = append(o.Tickets, t)
	}
	if len(o.Tickets) == 0 {
		return st, false, sdk.Permanent(fmt.Errorf("order %d has no tickets", job.Args.OrderID))
	}
	return st, missing == 0, nil
}

// Prepare renders the PDF and stores it, with no transaction open.
func (r *Render) Prepare(ctx context.Context, job sdk.Job[stagedoor.RenderTickets], st RenderState) (RenderState, error) {
	st.Order.StartsAt = st.Order.StartsAt.In(time.UTC)
	pdf, err := render.PDF(st.Order)
	if err != nil {
		return st, sdk.Permanent(err)
	}
	st.PDFKey = PDFKey(st.Order.PublicID)
	if err := r.Store.Put(ctx, st.PDFKey, pdf); err != nil {
		return st, fmt.Errorf("store %s: %w", st.PDFKey, err)
	}
	return st, nil
}

// Commit writes the key where it is still null; only the winning run queues
// the email, unless the job says its caller sends it.
func (r *Render) Commit(ctx context.Context, job sdk.Job[stagedoor.RenderTickets], tx *sdk.CommitTx, st RenderState) error {
	win, err := tx.WriteIf(ctx, `UPDATE tickets SET pdf_key = $1 WHERE order_id = $2 AND pdf_key IS NULL RETURNING id`,
		st.PDFKey, job.Args.OrderID)
	if err != nil {
		return err
	}
	if win == nil {
		job.Log.Info("tickets already rendered by another run", "order_id", job.Args.OrderID)
		return nil
	}
	job.Log.Info("tickets rendered", "order_id", job.Args.OrderID, "pdf_key", st.PDFKey, "tickets", win.Returned().Len())
	if job.Args.SendSeparately {
		return nil // its caller queues send_tickets (a checkout's step)
	}
	return win.Enqueue(ctx, stagedoor.SendTickets{OrderID: job.Args.OrderID})
}

// Package orders is the Stagedoor application's side of the example: it
// commits an order and, in the same transaction, the outbox rows of the jobs
// that follow from it.
package orders

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/plugins/stagedoor"
)

// Order is a purchase to place.
type Order struct {
	EventID int64
	Buyer   string
	Email   string
	Seats   int
}

// Placed is a committed order.
type Placed struct {
	ID        int64
	PublicID  string
	RequestID string
	OutboxIDs []int64
}

// CreateEvent adds an event with a zero sales counter.
func CreateEvent(ctx context.Context, pool *pgxpool.Pool, name, venue string) (int64, error) {
	var id int64
	err := pool.QueryRow(ctx, `INSERT INTO events (name, venue, starts_at) VALUES ($1, $2, now() + interval '30 days') RETURNING id`,
		name, venue).Scan(&id)
	return id, err
}

// Jobs chooses which jobs an order enqueues.
type Jobs struct {
	Counter bool // update_sales_counter
	Tickets bool // render_tickets (which enqueues send_tickets)
	// Priority of the jobs (outbox.Message.Priority; 0: the default): a
	// box-office order's tickets go out before a bulk import's.
	Priority int
}

// Place commits the order, one ticket row per seat, and the outbox rows of
// the chosen jobs in one transaction: the jobs exist if and only if the
// order does.
func Place(ctx context.Context, pool *pgxpool.Pool, o Order, jobs Jobs) (Placed, error) {
	var p Placed
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		p, err = PlaceTx(ctx, tx, o, jobs)
		return err
	})
	return p, err
}

// PlaceTx is Place inside the caller's transaction.
func PlaceTx(ctx context.Context, tx pgx.Tx, o Order, jobs Jobs) (Placed, error) {
	if o.Seats <= 0 {
		return Placed{}, fmt.Errorf("orders: an order needs at least one seat")
	}
	p := Placed{RequestID: "req-" + randHex(8)}
	err := tx.QueryRow(ctx, `
		INSERT INTO orders (public_id, event_id, buyer, email, seats)
		VALUES ('SD-' || upper(substr(md5(random()::text), 1, 10)), $1, $2, $3, $4)
		RETURNING id, public_id`, o.EventID, o.Buyer, o.Email, o.Seats).Scan(&p.ID, &p.PublicID)
	if err != nil {
		return Placed{}, fmt.Errorf("orders: insert: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO tickets (order_id, code, seat)
		SELECT $1, $2 || '-T' || n, 'R' || (1 + (n - 1) / 20) || '-S' || (1 + (n - 1) % 20)
		FROM generate_series(1, $3::int) AS n`, p.ID, p.PublicID, o.Seats); err != nil {
		return Placed{}, fmt.Errorf("orders: tickets: %w", err)
	}
	trace := fmt.Sprintf("00-%s-%s-01", randHex(16), randHex(8))
	var msgs []outbox.Message
	add := func(kind string, payload any) {
		b, _ := json.Marshal(payload)
		msgs = append(msgs, outbox.Message{Kind: kind, Payload: b, RequestID: p.RequestID, Trace: trace, Priority: jobs.Priority})
	}
	if jobs.Counter {
		add(stagedoor.UpdateSalesCounter{}.Kind(), stagedoor.UpdateSalesCounter{OrderID: p.ID, EventID: o.EventID})
	}
	if jobs.Tickets {
		add(stagedoor.RenderTickets{}.Kind(), stagedoor.RenderTickets{OrderID: p.ID})
	}
	p.OutboxIDs, err = outbox.Add(ctx, tx, msgs...)
	if err != nil {
		return Placed{}, err
	}
	return p, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

package client_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/client"
)

// The README's Go examples ("Enqueue from your application"), verbatim:
// TestREADMEGoExamples proves the README shows these functions as written
// here, and the tests in enqueue_test.go run them.

// placeOrder commits an order and the job that counts its seats.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, eventID int64, seats int) (int64, error) {
	var jobID int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var orderID int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (public_id, event_id, buyer, email, seats)
			VALUES (gen_random_uuid()::text, $1, 'Ada', 'ada@example.com', $2) RETURNING id`,
			eventID, seats).Scan(&orderID); err != nil {
			return err
		}
		var err error
		jobID, err = client.Enqueue(ctx, tx, client.Job{
			Kind:      "update_sales_counter",
			Payload:   map[string]int64{"order_id": orderID},
			RequestID: "req-go-pgx",
		})
		return err
	})
	return jobID, err
}

// placeOrderSQL is placeOrder with database/sql.
func placeOrderSQL(ctx context.Context, db *sql.DB, eventID int64, seats int) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() // a no-op once committed
	var orderID int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO orders (public_id, event_id, buyer, email, seats)
		VALUES (gen_random_uuid()::text, $1, 'Ada', 'ada@example.com', $2) RETURNING id`,
		eventID, seats).Scan(&orderID); err != nil {
		return 0, err
	}
	jobID, err := client.EnqueueSQL(ctx, tx, client.Job{
		Kind:    "update_sales_counter",
		Payload: json.RawMessage(fmt.Sprintf(`{"order_id": %d}`, orderID)),
	})
	if err != nil {
		return 0, err
	}
	return jobID, tx.Commit()
}

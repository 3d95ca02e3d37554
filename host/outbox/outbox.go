// Package outbox adds jobs to the transactional outbox and relays committed
// rows to the Redis stream.
//
// Application code calls Add inside the transaction that commits its
// business change, so the job exists if and only if the change does. The
// Relay publishes, then marks: a crash between the two publishes the row
// again, which the handlers' guards absorb. It never loses a row.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/usherhq/usher/internal/jobmsg"
)

// Querier is what Add needs of a transaction: pgx.Tx satisfies it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Message is one job to add to the outbox.
type Message struct {
	Kind string
	// Payload is the job's JSON payload.
	Payload json.RawMessage
	// RequestID and Trace (a W3C traceparent) follow the job into the
	// handler's log lines.
	RequestID string
	Trace     string
	// JobID keeps an existing job's identity (a scheduled retry, a requeued
	// dead letter). Empty for a new job, whose identity is its outbox id.
	JobID string
	// Attempt counts the retries of the job; 0 for a new job.
	Attempt int
}

// Limits of a message (the client's, see internal/jobmsg), so that its
// stream entry always fits the host's entry limit (entry.MaxBytes for
// the whole entry): an entry over it cannot be verified and is
// dead-lettered as a forgery would be.
const (
	MaxPayloadBytes = jobmsg.MaxPayloadBytes
	MaxKindBytes    = jobmsg.MaxKindBytes
	MaxMetaBytes    = jobmsg.MaxMetaBytes
)

// Add inserts msgs into the outbox inside the caller's transaction and
// returns their ids. The rows become visible to the relay when the caller
// commits. A message with no Trace gets a new W3C traceparent.
// Applications enqueue with package client, which shares these rules.
func Add(ctx context.Context, tx Querier, msgs ...Message) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	kinds := make([]string, len(msgs))
	payloads := make([]string, len(msgs))
	reqs := make([]string, len(msgs))
	traces := make([]string, len(msgs))
	jobIDs := make([]*string, len(msgs))
	attempts := make([]int32, len(msgs))
	for i, m := range msgs {
		if err := jobmsg.Check(m.Kind, m.Payload, m.RequestID, m.Trace, m.JobID); err != nil {
			return nil, fmt.Errorf("outbox: message %d: %w", i, err)
		}
		m.Trace = jobmsg.Trace(m.Trace)
		kinds[i], payloads[i], reqs[i], traces[i], attempts[i] = m.Kind, string(m.Payload), m.RequestID, m.Trace, int32(m.Attempt)
		if m.JobID != "" {
			id := m.JobID
			jobIDs[i] = &id
		}
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO outbox (kind, payload, request_id, trace, job_id, attempt)
		SELECT k, p::jsonb, r, t, j, a
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[])
		     WITH ORDINALITY AS m(k, p, r, t, j, a, n)
		ORDER BY n
		RETURNING id`, kinds, payloads, reqs, traces, jobIDs, attempts)
	if err != nil {
		return nil, fmt.Errorf("outbox: add: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("outbox: add: %w", err)
	}
	return ids, nil
}

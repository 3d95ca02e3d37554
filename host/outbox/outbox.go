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
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/usherhq/usher/internal/entry"
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
	// DedupKey and DedupWindow: as client.Job's. While a job of Kind
	// added with DedupKey is less than DedupWindow (default 24h) old, Add
	// returns that job's id for the message and adds nothing. Optional.
	DedupKey    string
	DedupWindow time.Duration
	// Priority: as client.Job's (0: entry.DefaultPriority). A retry and a
	// requeue carry the job's own.
	Priority int
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
	if slices.ContainsFunc(msgs, func(m Message) bool { return m.DedupKey != "" || m.DedupWindow != 0 }) {
		return addEach(ctx, tx, msgs)
	}
	kinds := make([]string, len(msgs))
	payloads := make([]string, len(msgs))
	reqs := make([]string, len(msgs))
	traces := make([]string, len(msgs))
	jobIDs := make([]*string, len(msgs))
	attempts := make([]int32, len(msgs))
	priorities := make([]int16, len(msgs))
	for i, m := range msgs {
		if err := check(m); err != nil {
			return nil, fmt.Errorf("outbox: message %d: %w", i, err)
		}
		m.Trace = jobmsg.Trace(m.Trace)
		kinds[i], payloads[i], reqs[i], traces[i], attempts[i] = m.Kind, string(m.Payload), m.RequestID, m.Trace, int32(m.Attempt)
		priorities[i] = int16(entry.PriorityOr(m.Priority))
		if m.JobID != "" {
			id := m.JobID
			jobIDs[i] = &id
		}
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO outbox (kind, payload, request_id, trace, job_id, attempt, priority, workflow)
		SELECT k, p::jsonb, r, t, j, a, pr, (SELECT s.workflow FROM workflow_steps s WHERE j IS NOT NULL AND s.job_id = j)
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::smallint[])
		     WITH ORDINALITY AS m(k, p, r, t, j, a, pr, n)
		ORDER BY n
		RETURNING id`, kinds, payloads, reqs, traces, jobIDs, attempts, priorities)
	if err != nil {
		return nil, fmt.Errorf("outbox: add: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("outbox: add: %w", err)
	}
	return ids, nil
}

// check is jobmsg's checks of m.
func check(m Message) error {
	if err := jobmsg.Check(m.Kind, m.Payload, m.RequestID, m.Trace, m.JobID); err != nil {
		return err
	}
	return jobmsg.CheckPriority(m.Kind, m.Priority)
}

// addEach is Add for a batch with deduplication keys, one message at a
// time, in order.
func addEach(ctx context.Context, tx Querier, msgs []Message) ([]int64, error) {
	ids := make([]int64, 0, len(msgs))
	for i, m := range msgs {
		if m.DedupKey == "" {
			if m.DedupWindow != 0 {
				return nil, fmt.Errorf("outbox: message %d: %s has a DedupWindow and no DedupKey", i, m.Kind)
			}
			id, err := Add(ctx, tx, m)
			if err != nil {
				return nil, err
			}
			ids = append(ids, id...)
			continue
		}
		if err := check(m); err != nil {
			return nil, fmt.Errorf("outbox: message %d: %w", i, err)
		}
		if m.DedupWindow < 0 {
			return nil, fmt.Errorf("outbox: message %d: %s has a negative DedupWindow", i, m.Kind)
		}
		var window *string
		if m.DedupWindow > 0 {
			w := fmt.Sprintf("%d microseconds", max(m.DedupWindow.Microseconds(), 1))
			window = &w
		}
		var id int64
		var won bool
		if err := tx.QueryRow(ctx, `SELECT id, won FROM usher_dedup_claim($1, $2, $3::interval)`, m.Kind, m.DedupKey, window).Scan(&id, &won); err != nil {
			return nil, fmt.Errorf("outbox: add: %w", err)
		}
		if won {
			var jobID *string
			if m.JobID != "" {
				jobID = &m.JobID
			}
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, kind, payload, request_id, trace, job_id, attempt, priority)
				VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7, $8)`, id, m.Kind, string(m.Payload), m.RequestID, jobmsg.Trace(m.Trace), jobID, m.Attempt,
				entry.PriorityOr(m.Priority)); err != nil {
				return nil, fmt.Errorf("outbox: add: %w", err)
			}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

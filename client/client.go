// Package client enqueues usher jobs from an application, inside the
// application's own Postgres transaction: the job exists if and only if the
// transaction commits. It depends on neither the host nor Redis; the
// host's relay publishes the committed row and a host runs it.
//
// Enqueue calls the usher_enqueue_job SQL function, so the application's
// database role needs only EXECUTE on it (see the README, "Enqueue from
// your application"), not the outbox table itself:
//
//	GRANT EXECUTE ON FUNCTION usher_enqueue_job(text, jsonb, text, text) TO app;
//
// A job with a DedupKey calls the six-argument form, which needs its own
// grant:
//
//	GRANT EXECUTE ON FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval) TO app;
//
// A job with a Priority other than the default calls the seven-argument
// form, with its own grant too:
//
//	GRANT EXECUTE ON FUNCTION usher_enqueue_job(text, jsonb, text, text, text, interval, integer) TO app;
//
// A job whose kind no running host serves yet waits (host.Config
// UnknownKindWait, default 1h) before it is dead-lettered, so an
// application may enqueue a new kind before the plugin serving it is
// deployed everywhere.
package client

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/internal/entry"
	"github.com/usherhq/usher/internal/jobmsg"
)

// Limits of a job, the host's: a job over one is refused by Enqueue and by
// usher_enqueue_job.
const (
	MaxPayloadBytes = jobmsg.MaxPayloadBytes
	MaxKindBytes    = jobmsg.MaxKindBytes
	MaxMetaBytes    = jobmsg.MaxMetaBytes // request_id and trace each
)

// Job is one job to enqueue.
type Job struct {
	// Kind names the handler that runs the job. Required.
	Kind string
	// Payload is marshalled with encoding/json; a json.RawMessage or
	// []byte is taken as the JSON itself. Default (nil): null.
	Payload any
	// RequestID follows the job into its handler's log lines. Optional.
	RequestID string
	// Trace is a W3C traceparent the job's runs continue. Default: a new
	// one, so every delivery and retry of the job shares one trace.
	Trace string
	// DedupKey, when set, makes the enqueue idempotent for a business key
	// (an order id, "points-order-4471"): while a job of the same Kind
	// enqueued with the same key is less than DedupWindow old, Enqueue
	// returns that job's id and enqueues nothing. The key is per kind (the
	// same key on two kinds is two jobs) and covers the first job whatever
	// became of it (run, retried, dead-lettered). The database enforces
	// it, so it holds across every application process and host, and
	// concurrent enqueues with one key make one job (the second waits for
	// the first's transaction: if it rolls back, the second enqueues). In
	// a REPEATABLE READ or SERIALIZABLE transaction that race may instead
	// fail with a serialization error (SQLSTATE 40001): retry the
	// transaction, as for any. At most MaxMetaBytes. Optional: empty
	// enqueues every time.
	DedupKey string
	// DedupWindow is how long DedupKey holds, from the enqueue that made
	// the job (a duplicate does not extend it); after it, the same key
	// enqueues a new job. Default (0): DefaultDedupWindow. Only with a
	// DedupKey.
	DedupWindow time.Duration
	// Priority orders the job among those waiting: HighestPriority (1)
	// starts before any job of a lower priority that waits, LowestPriority
	// (5) after every other. Its retries, its dead letter and the jobs its
	// handler enqueues keep it. Default (0): DefaultPriority (3).
	Priority int
}

// The priorities a Job may have.
const (
	HighestPriority = entry.HighestPriority
	DefaultPriority = entry.DefaultPriority
	LowestPriority  = entry.LowestPriority
)

// DefaultDedupWindow is how long a deduplication key holds when the job
// gives none: usher_enqueue_job's default too.
const DefaultDedupWindow = 24 * time.Hour

// PgxTx is what Enqueue needs of a pgx transaction: pgx.Tx satisfies it,
// and so do *pgx.Conn and *pgxpool.Pool (then the job commits on its own).
type PgxTx interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLTx is what EnqueueSQL needs of a database/sql transaction: *sql.Tx
// satisfies it (so do *sql.DB and *sql.Conn).
type SQLTx interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

const (
	enqueueSQL = `SELECT usher_enqueue_job($1, $2::jsonb, $3, $4)`
	// The form with a key; its window is sent as text ("N microseconds"),
	// which every driver passes and Postgres casts.
	enqueueDedupSQL = `SELECT usher_enqueue_job($1, $2::jsonb, $3, $4, $5, $6::interval)`
	// The form with a priority (its key and window NULL without one).
	enqueuePrioritySQL = `SELECT usher_enqueue_job($1, $2::jsonb, $3, $4, $5, $6::interval, $7::integer)`
)

// Enqueue adds job to the outbox in tx and returns its outbox id, which is
// the job's identity (the job id its handler sees). The job is published
// when tx commits; a rollback leaves nothing. With a DedupKey held by a job
// of the same kind still in its window, it returns that job's id and adds
// nothing.
func Enqueue(ctx context.Context, tx PgxTx, job Job) (int64, error) {
	query, args, err := prepare(job)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := tx.QueryRow(ctx, query, args...).Scan(&id); err != nil {
		return 0, fmt.Errorf("usher: enqueue %s: %w", job.Kind, err)
	}
	return id, nil
}

// EnqueueSQL is Enqueue for database/sql (with any Postgres driver: pgx's
// stdlib, lib/pq).
func EnqueueSQL(ctx context.Context, tx SQLTx, job Job) (int64, error) {
	query, args, err := prepare(job)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := tx.QueryRowContext(ctx, query, args...).Scan(&id); err != nil {
		return 0, fmt.Errorf("usher: enqueue %s: %w", job.Kind, err)
	}
	return id, nil
}

// prepare marshals the payload and checks the job before a round trip
// (usher_enqueue_job checks it again, for callers in other languages), and
// returns the statement that enqueues it.
func prepare(job Job) (query string, args []any, err error) {
	var b []byte
	switch p := job.Payload.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		if b, err = json.Marshal(p); err != nil {
			return "", nil, fmt.Errorf("usher: %s payload: %w", job.Kind, err)
		}
	}
	if len(b) == 0 {
		b = []byte("null")
	}
	if err := jobmsg.Check(job.Kind, b, job.RequestID, job.Trace, ""); err != nil {
		return "", nil, fmt.Errorf("usher: %w", err)
	}
	args = []any{job.Kind, string(b), job.RequestID, jobmsg.Trace(job.Trace)}
	if err := jobmsg.CheckPriority(job.Kind, job.Priority); err != nil {
		return "", nil, fmt.Errorf("usher: %w", err)
	}
	query, args, err = prepareDedup(job, args)
	if err != nil || job.Priority == 0 || job.Priority == DefaultPriority {
		return query, args, err
	}
	if query == enqueueSQL {
		args = append(args, nil, nil)
	}
	return enqueuePrioritySQL, append(args, job.Priority), nil
}

// prepareDedup returns the statement for job's deduplication key (none,
// or one) and its arguments.
func prepareDedup(job Job, args []any) (string, []any, error) {
	switch {
	case job.DedupKey == "" && job.DedupWindow != 0:
		return "", nil, fmt.Errorf("usher: %s job has a DedupWindow and no DedupKey", job.Kind)
	case job.DedupKey == "":
		return enqueueSQL, args, nil
	case len(job.DedupKey) > MaxMetaBytes:
		return "", nil, fmt.Errorf("usher: %s deduplication key of %d bytes is over the %d-byte limit", job.Kind, len(job.DedupKey), MaxMetaBytes)
	case job.DedupWindow < 0:
		return "", nil, errors.New("usher: " + job.Kind + " job has a negative DedupWindow")
	}
	window := job.DedupWindow
	if window == 0 {
		window = DefaultDedupWindow
	}
	return enqueueDedupSQL, append(args, job.DedupKey, fmt.Sprintf("%d microseconds", max(window.Microseconds(), 1))), nil
}

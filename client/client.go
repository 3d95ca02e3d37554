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
// A job whose kind no running host serves yet waits (host.Config
// UnknownKindWait, default 1h) before it is dead-lettered, so an
// application may enqueue a new kind before the plugin serving it is
// deployed everywhere.
package client

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

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
}

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

const enqueueSQL = `SELECT usher_enqueue_job($1, $2::jsonb, $3, $4)`

// Enqueue adds job to the outbox in tx and returns its outbox id, which is
// the job's identity (the job id its handler sees). The job is published
// when tx commits; a rollback leaves nothing.
func Enqueue(ctx context.Context, tx PgxTx, job Job) (int64, error) {
	payload, trace, err := prepare(job)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := tx.QueryRow(ctx, enqueueSQL, job.Kind, payload, job.RequestID, trace).Scan(&id); err != nil {
		return 0, fmt.Errorf("usher: enqueue %s: %w", job.Kind, err)
	}
	return id, nil
}

// EnqueueSQL is Enqueue for database/sql (with any Postgres driver: pgx's
// stdlib, lib/pq).
func EnqueueSQL(ctx context.Context, tx SQLTx, job Job) (int64, error) {
	payload, trace, err := prepare(job)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := tx.QueryRowContext(ctx, enqueueSQL, job.Kind, payload, job.RequestID, trace).Scan(&id); err != nil {
		return 0, fmt.Errorf("usher: enqueue %s: %w", job.Kind, err)
	}
	return id, nil
}

// prepare marshals the payload and checks the job before a round trip;
// usher_enqueue_job checks it again, for callers in other languages.
func prepare(job Job) (payload, trace string, err error) {
	var b []byte
	switch p := job.Payload.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		if b, err = json.Marshal(p); err != nil {
			return "", "", fmt.Errorf("usher: %s payload: %w", job.Kind, err)
		}
	}
	if len(b) == 0 {
		b = []byte("null")
	}
	if err := jobmsg.Check(job.Kind, b, job.RequestID, job.Trace, ""); err != nil {
		return "", "", fmt.Errorf("usher: %w", err)
	}
	return string(b), jobmsg.Trace(job.Trace), nil
}

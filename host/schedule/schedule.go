// Package schedule keeps delayed runs of jobs in Postgres and moves them to
// the outbox when they are due.
//
// A RetryLater, a transient failure or a timeout becomes a row keyed by
// (job identity, attempt): the host commits it before acking the stream
// entry, and a crash between the two makes the redelivery try to schedule
// the same (identity, attempt), which is absorbed. A due run goes back
// through the outbox with its identity, so guard 4 still recognises it.
package schedule

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/internal/periodic"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/entry"
)

// Run is one delayed run of a job.
type Run struct {
	JobID     string
	Attempt   int
	Kind      string
	Payload   json.RawMessage
	RequestID string
	Trace     string
	Reason    string
	RunAt     time.Time
	// Priority is the job's (0: entry.DefaultPriority): the run is
	// enqueued with it.
	Priority int
	// WaitsFor, when set, names the effect claim this run waits for
	// (guard 2's claim held by another run): a wake of that claim
	// (WakeClaim) moves the run to now. WaitsSince is when the run that
	// found it held started: a wake since then, committed before this run
	// is added, makes it due at once.
	WaitsFor   string
	WaitsSince time.Time
}

// Add schedules r. It reports false when that (identity, attempt) was already
// scheduled: a redelivery of an entry whose ack was lost.
func Add(ctx context.Context, q outbox.Querier, r Run) (bool, error) {
	if r.JobID == "" || r.Kind == "" {
		return false, errors.New("schedule: a run needs a job id and a kind")
	}
	if !json.Valid(r.Payload) {
		return false, fmt.Errorf("schedule: %s payload is not valid JSON", r.Kind)
	}
	if r.WaitsFor != "" {
		// In the caller's transaction: WakeClaim takes the same lock, so
		// either its update sees this row or this insert sees its wake.
		if _, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('usher-claim-wake/' || $1, 0))`, r.WaitsFor); err != nil {
			return false, fmt.Errorf("schedule: add: %w", err)
		}
	}
	tag, err := q.Exec(ctx, `
		INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, request_id, trace, reason, run_at, waits_for, priority)
		SELECT $1, $2, $3, $4::jsonb, $5, $6, $7,
		       CASE WHEN EXISTS (SELECT 1 FROM claim_wakes w WHERE w.waits_for = $9 AND w.at >= $10) THEN now() ELSE $8 END, $9, $11
		ON CONFLICT (job_id, attempt) DO NOTHING`,
		r.JobID, r.Attempt, r.Kind, string(r.Payload), r.RequestID, r.Trace, r.Reason, r.RunAt, nullText(r.WaitsFor), r.WaitsSince,
		entry.PriorityOr(r.Priority))
	if err != nil {
		return false, fmt.Errorf("schedule: add: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

func nullText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// WakeClaim makes the runs waiting for the effect claim key (Run.WaitsFor)
// due now, and records the wake for a run added after it; it returns how
// many it moved. The claim's owner calls it once it marked the claim done
// or gave it back. One round trip: the statements are one batch, which
// Postgres runs as one transaction.
func WakeClaim(ctx context.Context, db Batcher, key string) (int64, error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended('usher-claim-wake/' || $1, 0))`, key)
	b.Queue(`INSERT INTO claim_wakes (waits_for, at) VALUES ($1, clock_timestamp())
		ON CONFLICT (waits_for) DO UPDATE SET at = EXCLUDED.at`, key)
	b.Queue(`UPDATE scheduled_jobs SET run_at = now() WHERE waits_for = $1 AND enqueued_at IS NULL AND run_at > now()`, key)
	b.Queue(`DELETE FROM claim_wakes WHERE ctid IN (
		SELECT ctid FROM claim_wakes WHERE at < now() - interval '1 minute' ORDER BY at LIMIT 2 FOR UPDATE SKIP LOCKED)`)
	br := db.SendBatch(ctx, b)
	var n int64
	var err error
	for i := range 4 {
		tag, e := br.Exec()
		if e != nil {
			err = e
			break
		}
		if i == 2 {
			n = tag.RowsAffected()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("schedule: wake the runs waiting for a claim: %w", err)
	}
	return n, nil
}

// Batcher is what WakeClaim needs: *pgxpool.Pool, *pgx.Conn.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// NewJob schedules a job born in the scheduler, minting its identity.
func NewJob(ctx context.Context, q outbox.Querier, kind string, payload json.RawMessage, runAt time.Time, requestID, trace string) (string, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	id := "s-" + hex.EncodeToString(b[:])
	_, err := Add(ctx, q, Run{JobID: id, Kind: kind, Payload: payload, RunAt: runAt, RequestID: requestID, Trace: trace, Reason: "scheduled"})
	return id, err
}

// Config configures a Scheduler.
type Config struct {
	// Pool is the Postgres pool. Required.
	Pool *pgxpool.Pool
	// Interval between scans for due runs. Default 500ms.
	Interval time.Duration
	// BatchSize is how many due runs one transaction moves. Default 256.
	BatchSize int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Scheduler moves due runs into the outbox.
type Scheduler struct {
	cfg Config
}

// New validates cfg and fills its defaults.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("schedule: needs Pool")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Scheduler{cfg: cfg}, nil
}

// Run moves due runs until ctx is done.
func (s *Scheduler) Run(ctx context.Context) error {
	return periodic.Drain(ctx, s.cfg.Interval, s.cfg.Logger, "scheduler scan failed", s.cfg.BatchSize, s.MoveDue)
}

// MoveDue moves one batch of due runs into the outbox, in one transaction,
// and returns how many it moved. Several schedulers may run at once.
func (s *Scheduler) MoveDue(ctx context.Context) (int, error) {
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, `
		SELECT job_id, attempt, kind, payload::text, request_id, trace, priority
		FROM scheduled_jobs
		WHERE enqueued_at IS NULL AND run_at <= now()
		ORDER BY run_at LIMIT $1
		FOR UPDATE SKIP LOCKED`, s.cfg.BatchSize)
	if err != nil {
		return 0, err
	}
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Message, error) {
		var m outbox.Message
		var payload string
		err := r.Scan(&m.JobID, &m.Attempt, &m.Kind, &payload, &m.RequestID, &m.Trace, &m.Priority)
		m.Payload = json.RawMessage(payload)
		return m, err
	})
	if err != nil || len(due) == 0 {
		return 0, err
	}
	if _, err := outbox.Add(ctx, tx, due...); err != nil {
		return 0, err
	}
	ids := make([]string, len(due))
	attempts := make([]int32, len(due))
	for i, m := range due {
		ids[i], attempts[i] = m.JobID, int32(m.Attempt)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE scheduled_jobs s SET enqueued_at = now()
		FROM unnest($1::text[], $2::int[]) AS d(job_id, attempt)
		WHERE s.job_id = d.job_id AND s.attempt = d.attempt`, ids, attempts); err != nil {
		return 0, err
	}
	return len(due), tx.Commit(ctx)
}

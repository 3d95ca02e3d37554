package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
)

// JobFilter selects outbox rows; an empty field matches anything.
type JobFilter struct {
	// ID is a job identity: a row's own id for a new job, or the job_id a
	// scheduled retry or a requeued dead letter carries.
	ID        string
	Kind      string
	Outcome   string
	RequestID string
	// Limit bounds the rows returned, newest first. Default 100.
	Limit int
}

// Job is one outbox row: one run of a job (a retry or a requeue adds a row
// keeping the job's identity).
type Job struct {
	Row         int64      `json:"row"`
	JobID       string     `json:"job_id"`
	Kind        string     `json:"kind"`
	Attempt     int        `json:"attempt"`
	RequestID   string     `json:"request_id"`
	CreatedAt   time.Time  `json:"created_at"`
	PublishedAt *time.Time `json:"published_at"`
	DoneAt      *time.Time `json:"done_at"`
	// Outcome is how the row's job ended so far (applied, absorbed,
	// retry_scheduled, dead_letter): a row whose attempt was retried or
	// dead-lettered takes the outcome of the job's later row when that
	// one ends, so retry_scheduled means the job waits to run again. What
	// each attempt did is in the job's history. Empty while the row has
	// not ended.
	Outcome     string `json:"outcome"`
	Republished int    `json:"republished"`
}

// FindJobs returns the outbox rows f selects, newest first.
func FindJobs(ctx context.Context, q outbox.Querier, f JobFilter) ([]Job, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, `SELECT id, coalesce(job_id, id::text), kind, attempt, request_id, created_at,
			published_at, done_at, coalesce(outcome, ''), republished
		FROM outbox
		WHERE ($1 = '' OR coalesce(job_id, id::text) = $1)
		  AND ($2 = '' OR kind = $2)
		  AND ($3 = '' OR coalesce(outcome, '') = $3)
		  AND ($4 = '' OR request_id = $4)
		ORDER BY id DESC LIMIT $5`, f.ID, f.Kind, f.Outcome, f.RequestID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("ops: jobs: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Job])
}

// Kinds are the job kinds the outbox has seen, for a filter's choices.
func Kinds(ctx context.Context, q outbox.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT kind FROM outbox ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("ops: kinds: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

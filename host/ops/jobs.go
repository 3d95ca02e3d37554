package ops

import (
	"context"
	"errors"
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
	// From and To bound the rows' created_at: From <= created_at < To.
	// A zero time does not bound.
	From, To time.Time
	// Error matches a row whose job's last error in the job history (its
	// newest record with an error) holds it, in any case.
	Error string
	// Before is the row id a page starts below (the last row of the page
	// before it); 0 starts at the newest.
	Before int64
	// Limit bounds the rows returned, newest first. Default 100.
	Limit int
}

// Check says what is wrong with f's bounds.
func (f JobFilter) Check() error {
	if !f.From.IsZero() && !f.To.IsZero() && f.From.After(f.To) {
		return fmt.Errorf("from %s is after to %s", f.From.UTC().Format(time.RFC3339), f.To.UTC().Format(time.RFC3339))
	}
	if f.Before < 0 {
		return errors.New("before must be a row id (positive)")
	}
	return nil
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
	// LastError is the job's last error in the job history ("" when none).
	LastError string `json:"last_error,omitempty"`
}

// jobWhere is the condition FindJobs and CountJobs share: $1 id, $2 kind,
// $3 outcome, $4 request id, $5 from, $6 to, $7 error text.
const jobWhere = `($1 = '' OR coalesce(o.job_id, o.id::text) = $1)
	  AND ($2 = '' OR o.kind = $2)
	  AND ($3 = '' OR coalesce(o.outcome, '') = $3)
	  AND ($4 = '' OR o.request_id = $4)
	  AND ($5::timestamptz IS NULL OR o.created_at >= $5)
	  AND ($6::timestamptz IS NULL OR o.created_at < $6)`

// errorWhere is jobWhere's error text condition, over lastError's e.
const errorWhere = ` AND ($7 = '' OR strpos(lower(e.error), lower($7)) > 0)`

// lastError joins each row to its job's last error in the history.
const lastError = `LEFT JOIN LATERAL (SELECT h.error FROM job_history h
		WHERE h.job_id = coalesce(o.job_id, o.id::text) AND h.error <> '' ORDER BY h.finished_at DESC, h.id DESC LIMIT 1) e ON true`

func (f JobFilter) args() []any {
	var from, to *time.Time
	if !f.From.IsZero() {
		from = &f.From
	}
	if !f.To.IsZero() {
		to = &f.To
	}
	return []any{f.ID, f.Kind, f.Outcome, f.RequestID, from, to, f.Error}
}

// FindJobs returns the outbox rows f selects, newest first, below
// f.Before, at most f.Limit of them.
func FindJobs(ctx context.Context, q outbox.Querier, f JobFilter) ([]Job, error) {
	if err := f.Check(); err != nil {
		return nil, fmt.Errorf("ops: jobs: %w", err)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, `SELECT o.id, coalesce(o.job_id, o.id::text), o.kind, o.attempt, o.request_id, o.created_at,
			o.published_at, o.done_at, coalesce(o.outcome, ''), o.republished, coalesce(e.error, '')
		FROM outbox o `+lastError+`
		WHERE `+jobWhere+errorWhere+` AND ($8 = 0 OR o.id < $8)
		ORDER BY o.id DESC LIMIT $9`, append(f.args(), f.Before, f.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("ops: jobs: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Job])
}

// CountJobs counts the outbox rows f selects whatever f.Before and
// f.Limit, and how many of them come before f.Before's page (are newer).
func CountJobs(ctx context.Context, q outbox.Querier, f JobFilter) (total, before int64, err error) {
	if err := f.Check(); err != nil {
		return 0, 0, fmt.Errorf("ops: count jobs: %w", err)
	}
	// The join to the history only when the error text is searched: a
	// count over every row would look each row's job up.
	from, where := "outbox o", jobWhere+" AND $7 = ''"
	if f.Error != "" {
		from, where = "outbox o "+lastError, jobWhere+errorWhere
	}
	err = q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE $8 > 0 AND o.id >= $8)
		FROM `+from+` WHERE `+where, append(f.args(), f.Before)...).Scan(&total, &before)
	if err != nil {
		return 0, 0, fmt.Errorf("ops: count jobs: %w", err)
	}
	return total, before, nil
}

// Kinds are the job kinds the outbox has seen, for a filter's choices.
func Kinds(ctx context.Context, q outbox.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT kind FROM outbox ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("ops: kinds: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

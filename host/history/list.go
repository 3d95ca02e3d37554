package history

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
)

// Filter selects the jobs List returns; a zero field selects all.
type Filter struct {
	// ID is a job identity; RequestID the request that started it.
	ID, RequestID string
	Kind          string
	// State is one of States.
	State string
	// From and To bound the jobs' creation (their latest outbox row's
	// created_at, kept after retention): From <= created < To. A zero
	// time does not bound.
	From, To time.Time
	// Error matches a job whose last error in its history (its newest
	// record with an error) holds it, in any case.
	Error string
	// Offset is how many of the jobs selected, newest first, come before
	// the ones returned.
	Offset int
	// Limit is at most how many to return. Required (positive).
	Limit int
}

// Check says what is wrong with f.
func (f Filter) Check() error {
	switch {
	case f.Limit <= 0:
		return errors.New("a list needs a positive limit")
	case f.Offset < 0:
		return fmt.Errorf("offset %d is below 0", f.Offset)
	case f.State != "" && !slices.Contains(States, f.State):
		return fmt.Errorf("no state %q (one of %v)", f.State, States)
	case !f.From.IsZero() && !f.To.IsZero() && f.From.After(f.To):
		return fmt.Errorf("from %s is after to %s", f.From.UTC().Format(time.RFC3339), f.To.UTC().Format(time.RFC3339))
	}
	return nil
}

// Listed is one job as List returns it.
type Listed struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	State     string    `json:"state"`
	RequestID string    `json:"request_id"`
	Attempts  int       `json:"attempts"`
	Outcome   string    `json:"outcome,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// RetryAt is when a job waiting to retry is due.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// LastError is its newest error in its history ("" when none).
	LastError string `json:"last_error,omitempty"`
}

// States are the states a Filter may name.
var States = []string{Pending, Running, WaitingToRetry, Done, DeadLetteredState, Cancelled, Discarded, Unknown}

// listSQL reads every job f selects in the state GetJob gives it: from
// its latest outbox row, or, once retention deleted its rows, from what
// the delete kept of them (job_links: the latest row's outcome, the rows'
// count and highest attempt); then its scheduled run and dead letter. $1
// kind, $2 state, $3 limit, $4 id, $5 request, $6 from, $7 to, $8 error,
// $9 offset.
const listSQL = `
WITH kept AS (
	SELECT DISTINCT ON (coalesce(job_id, id::text)) coalesce(job_id, id::text) AS job, kind, request_id,
	       coalesce(outcome, '') AS outcome, published_at IS NOT NULL AS published, done_at IS NOT NULL AS done,
	       count(*) OVER j AS rows, max(attempt) OVER j AS attempt, created_at
	FROM outbox
	WHERE ($1 = '' OR kind = $1) AND ($4 = '' OR coalesce(job_id, id::text) = $4) AND ($5 = '' OR request_id = $5)
	WINDOW j AS (PARTITION BY coalesce(job_id, id::text))
	ORDER BY coalesce(job_id, id::text), id DESC
), trimmed AS (
	SELECT job_id AS job, kind, request_id, coalesce(outcome, '') AS outcome, rows, attempt, created_at
	FROM job_links
	WHERE created_at IS NOT NULL AND ($1 = '' OR kind = $1) AND ($4 = '' OR job_id = $4) AND ($5 = '' OR request_id = $5)
), latest AS (
	SELECT k.job, k.kind, k.request_id, k.outcome, k.published, k.done, true AS kept,
	       greatest(k.rows + coalesce(t.rows, 0), greatest(k.attempt, t.attempt) + 1) AS attempts, k.created_at
	FROM kept k LEFT JOIN trimmed t ON t.job = k.job
	UNION ALL
	SELECT t.job, t.kind, t.request_id, t.outcome, true, true, false, greatest(t.rows, t.attempt + 1), t.created_at
	FROM trimmed t WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.job = t.job)
), waiting AS (
	SELECT job_id, min(run_at) AS run_at, min(kind) AS kind, min(request_id) AS request_id, min(created_at) AS created_at
	FROM scheduled_jobs
	WHERE enqueued_at IS NULL AND ($1 = '' OR kind = $1) AND ($4 = '' OR job_id = $4) AND ($5 = '' OR request_id = $5)
	GROUP BY job_id
), jobs AS (
	SELECT l.job, l.kind, l.request_id, l.attempts, l.outcome, l.created_at, w.run_at,
	       CASE WHEN EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = l.job AND d.requeued_at IS NULL AND d.discarded_at IS NULL) THEN 'dead_lettered'
	            WHEN l.outcome = 'dead_letter' AND EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = l.job AND d.discarded_at IS NOT NULL) THEN 'discarded'
	            WHEN w.job_id IS NOT NULL THEN 'waiting_to_retry'
	            WHEN NOT l.published THEN 'pending'
	            WHEN NOT l.done THEN 'running'
	            WHEN l.outcome IN ('applied', 'absorbed') THEN 'done'
	            WHEN l.outcome = 'cancelled' THEN 'cancelled'
	            WHEN NOT l.kept THEN 'unknown'
	            ELSE 'running' END AS state
	FROM latest l LEFT JOIN waiting w ON w.job_id = l.job
	UNION ALL
	SELECT w.job_id, w.kind, w.request_id, 0, '', w.created_at, w.run_at, 'waiting_to_retry'
	FROM waiting w WHERE NOT EXISTS (SELECT 1 FROM latest l WHERE l.job = w.job_id)
), matched AS (
	SELECT * FROM jobs j
	WHERE ($2 = '' OR state = $2)
	  AND ($6::timestamptz IS NULL OR created_at >= $6) AND ($7::timestamptz IS NULL OR created_at < $7)
	  AND ($8 = '' OR strpos(lower((` + lastErrorSQL + `)), lower($8)) > 0)
), page AS (
	SELECT *, count(*) OVER () AS total FROM matched ORDER BY created_at DESC, job DESC LIMIT $3 OFFSET $9
)
SELECT job, kind, state, request_id, attempts, outcome, created_at, run_at, coalesce((` + lastErrorSQL + `), ''), total
FROM page j ORDER BY created_at DESC, job DESC`

// lastErrorSQL is the newest error in the history of job j.job.
const lastErrorSQL = `SELECT h.error FROM job_history h WHERE h.job_id = j.job AND h.error <> '' ORDER BY h.finished_at DESC, h.id DESC LIMIT 1`

// List returns the jobs f selects, newest first, f.Offset of them
// skipped and at most f.Limit, and how many f selects in all. A job is its
// identity: a retry's and a requeue's rows are one job, in the state and
// with the attempts GetJob gives it, whether its outbox rows are kept or
// retention deleted them (it reads what the delete kept, job_links). A
// job born in the scheduler with no outbox row yet is listed as waiting
// to retry. A job whose rows went before retention kept what they said
// (before migration 00088) is found only by its id (GetJob).
func List(ctx context.Context, q outbox.Querier, f Filter) (jobs []Listed, total int, err error) {
	if err := f.Check(); err != nil {
		return nil, 0, fmt.Errorf("history: list: %w", err)
	}
	var from, to *time.Time
	if !f.From.IsZero() {
		from = &f.From
	}
	if !f.To.IsZero() {
		to = &f.To
	}
	rows, err := q.Query(ctx, listSQL, f.Kind, f.State, f.Limit, f.ID, f.RequestID, from, to, f.Error, f.Offset)
	if err != nil {
		return nil, 0, fmt.Errorf("history: list jobs: %w", err)
	}
	jobs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Listed, error) {
		var l Listed
		err := r.Scan(&l.ID, &l.Kind, &l.State, &l.RequestID, &l.Attempts, &l.Outcome, &l.CreatedAt, &l.RetryAt, &l.LastError, &total)
		if l.State != WaitingToRetry {
			l.RetryAt = nil
		}
		return l, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("history: list jobs: %w", err)
	}
	if len(jobs) == 0 && f.Offset > 0 {
		// Past the last page: the total is still wanted.
		_, total, err = List(ctx, q, Filter{ID: f.ID, RequestID: f.RequestID, Kind: f.Kind, State: f.State,
			From: f.From, To: f.To, Error: f.Error, Limit: 1})
	}
	return jobs, total, err
}

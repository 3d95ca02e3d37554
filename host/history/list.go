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
	Kind string
	// State is one of States.
	State string
	// Limit is at most how many to return. Required (positive).
	Limit int
}

// Listed is one job as List returns it: its latest outbox row's state.
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
}

// States are the states a Filter may name.
var States = []string{Pending, Running, WaitingToRetry, Done, DeadLetteredState, Cancelled, Discarded}

// List returns the jobs f selects, newest first, at most f.Limit of them,
// and how many f selects in all. A job is its identity: a retry's and a
// requeue's rows are one job, in the state GetJob gives it. A job born in
// the scheduler with no outbox row yet is listed as waiting to retry.
// Jobs whose rows retention trimmed are not listed (GetJob still shows
// their history).
func List(ctx context.Context, q outbox.Querier, f Filter) (jobs []Listed, total int, err error) {
	if f.Limit <= 0 {
		return nil, 0, errors.New("history: list needs a positive limit")
	}
	if f.State != "" && !slices.Contains(States, f.State) {
		return nil, 0, fmt.Errorf("history: no state %q (one of %v)", f.State, States)
	}
	rows, err := q.Query(ctx, `
		WITH latest AS (
			SELECT DISTINCT ON (coalesce(job_id, id::text)) coalesce(job_id, id::text) AS job, id, kind, request_id,
			       coalesce(outcome, '') AS outcome, published_at IS NOT NULL AS published, done_at IS NOT NULL AS done,
			       count(*) OVER (PARTITION BY coalesce(job_id, id::text)) AS attempts, created_at
			FROM outbox WHERE $1 = '' OR kind = $1
			ORDER BY coalesce(job_id, id::text), id DESC
		), waiting AS (
			SELECT job_id, min(run_at) AS run_at, min(kind) AS kind, min(request_id) AS request_id, min(created_at) AS created_at
			FROM scheduled_jobs WHERE enqueued_at IS NULL AND ($1 = '' OR kind = $1) GROUP BY job_id
		), jobs AS (
			SELECT l.job, l.kind, l.request_id, l.attempts, l.outcome, l.created_at, w.run_at,
			       CASE WHEN EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = l.job AND d.requeued_at IS NULL AND d.discarded_at IS NULL) THEN 'dead_lettered'
			            WHEN l.outcome = 'dead_letter' AND EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = l.job AND d.discarded_at IS NOT NULL) THEN 'discarded'
			            WHEN w.job_id IS NOT NULL THEN 'waiting_to_retry'
			            WHEN NOT l.published THEN 'pending'
			            WHEN NOT l.done THEN 'running'
			            WHEN l.outcome IN ('applied', 'absorbed') THEN 'done'
			            WHEN l.outcome = 'cancelled' THEN 'cancelled'
			            ELSE 'running' END AS state
			FROM latest l LEFT JOIN waiting w ON w.job_id = l.job
			UNION ALL
			SELECT w.job_id, w.kind, w.request_id, 0, '', w.created_at, w.run_at, 'waiting_to_retry'
			FROM waiting w WHERE NOT EXISTS (SELECT 1 FROM latest l WHERE l.job = w.job_id)
		)
		SELECT job, kind, state, request_id, attempts, outcome, created_at, run_at, count(*) OVER ()
		FROM jobs WHERE $2 = '' OR state = $2
		ORDER BY created_at DESC, job DESC LIMIT $3`, f.Kind, f.State, f.Limit)
	if err != nil {
		return nil, 0, fmt.Errorf("history: list jobs: %w", err)
	}
	jobs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Listed, error) {
		var l Listed
		err := r.Scan(&l.ID, &l.Kind, &l.State, &l.RequestID, &l.Attempts, &l.Outcome, &l.CreatedAt, &l.RetryAt, &total)
		if l.State != WaitingToRetry {
			l.RetryAt = nil
		}
		return l, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("history: list jobs: %w", err)
	}
	return jobs, total, nil
}

package history

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/pause"
)

// States a job is in.
const (
	// Pending: committed to the outbox, not yet on the stream.
	Pending = "pending"
	// Running: on the stream, not finished (running, or waiting for a
	// consumer or a reclaim).
	Running = "running"
	// WaitingToRetry: a delayed run is scheduled.
	WaitingToRetry = "waiting_to_retry"
	// Done: applied (or found already applied).
	Done = "done"
	// DeadLetteredState: an open dead letter holds it.
	DeadLetteredState = "dead_lettered"
	// Cancelled: cancelled before it started (by an operator, or its
	// workflow); nothing runs it.
	Cancelled = "cancelled"
	// Discarded: its dead letter was discarded by an operator (kept, not
	// open); nothing runs it.
	Discarded = "discarded"
	// Unknown: only history is left (its outbox rows were trimmed), and
	// its last record does not say how it ended.
	Unknown = "unknown"
)

// Final reports whether a job in state is waiting for nothing the
// runtime does: done, cancelled, discarded, dead-lettered (until an
// operator requeues it) or unknown (only its history is left).
func Final(state string) bool {
	switch state {
	case Pending, Running, WaitingToRetry:
		return false
	}
	return true
}

// ErrNotFound: no outbox row, dead letter or history names the job or
// request.
var ErrNotFound = errors.New("history: not found")

// Job is one job (one identity: its outbox row's id, kept by its retries
// and requeues) with its state and every delivery's record.
type Job struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	RequestID string `json:"request_id"`
	// Parent is the job whose handler enqueued it ("" for the
	// application's).
	Parent string `json:"parent_job_id,omitempty"`
	State  string `json:"state"`
	// Outcome is its latest outbox row's recorded outcome, "" if none.
	Outcome string `json:"outcome,omitempty"`
	// Attempts counts its runs: its outbox rows (a retry or a requeue
	// adds one), or, once retention deleted some, one more than the
	// highest attempt its rows or its history name.
	Attempts int `json:"attempts"`
	// Priority is its latest outbox row's, 1 (the highest) to 5; 0 when
	// no outbox row of it is kept.
	Priority int `json:"priority,omitempty"`
	// RetryAt is when its scheduled run is due (WaitingToRetry).
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// DeadLetter is its open (or discarded) dead letter's id and reason.
	DeadLetter       int64  `json:"dead_letter_id,omitempty"`
	DeadLetterReason string `json:"dead_letter_reason,omitempty"`
	// HeldBy is the pause on its kind, when it is pending or running and
	// its kind is paused: no host starts it (its entry is parked) until
	// the kind is resumed. GetJob fills it in.
	HeldBy *pause.Paused `json:"held_by_pause,omitempty"`
	// Actions are what operators did to it (cancel, run now, discard,
	// requeue), oldest first; GetJob fills them in.
	Actions []pause.Action `json:"actions,omitempty"`
	// Absorbed counts the duplicate deliveries its guard absorbed.
	Absorbed int      `json:"absorbed"`
	History  []Record `json:"history"`
	Children []*Job   `json:"children,omitempty"`
	// Payload is its payload where still kept (GetJob fills it in).
	Payload *Payload `json:"payload,omitempty"`
}

// Workflow is the jobs one request started, as a tree: the application's
// jobs at its roots, each job's follow-ons under it.
type Workflow struct {
	RequestID string `json:"request_id"`
	Jobs      []*Job `json:"jobs"`
	// Count of jobs in the tree, and of each state.
	Count  int            `json:"count"`
	States map[string]int `json:"states"`
}

// All lists w's jobs, each before the jobs it enqueued.
func (w *Workflow) All() []*Job {
	var out []*Job
	var walk func(jobs []*Job)
	walk = func(jobs []*Job) {
		for _, j := range jobs {
			out = append(out, j)
			walk(j.Children)
		}
	}
	walk(w.Jobs)
	return out
}

// FirstStart is when the first delivery of any of w's jobs started; zero
// when none is recorded. A request's deliveries are read on one time axis
// from it.
func (w *Workflow) FirstStart() time.Time {
	var first time.Time
	for _, j := range w.All() {
		for _, r := range j.History {
			if first.IsZero() || r.StartedAt.Before(first) {
				first = r.StartedAt
			}
		}
	}
	return first
}

// outboxRow is what a job's state is read from.
type outboxRow struct {
	jobID, kind, requestID, parent, outcome string
	attempt, priority                       int
	published, done                         bool
}

const outboxCols = `coalesce(job_id, id::text), kind, request_id, coalesce(parent_job_id, ''), coalesce(outcome, ''),
	attempt, priority, published_at IS NOT NULL, done_at IS NOT NULL`

func scanOutbox(rows pgx.Rows) ([]outboxRow, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		err := r.Scan(&o.jobID, &o.kind, &o.requestID, &o.parent, &o.outcome, &o.attempt, &o.priority, &o.published, &o.done)
		return o, err
	})
}

// GetJob reads one job by its identity.
func GetJob(ctx context.Context, q outbox.Querier, id string) (*Job, error) {
	// An outbox-born job's identity is its row's id; a retry's or a
	// requeue's row carries it in job_id.
	rowID, _ := strconv.ParseInt(id, 10, 64)
	rows, err := q.Query(ctx, `SELECT `+outboxCols+` FROM outbox
		WHERE job_id = $1 OR (job_id IS NULL AND id = $2) ORDER BY id`, id, rowID)
	if err != nil {
		return nil, fmt.Errorf("history: job %s: %w", id, err)
	}
	ors, err := scanOutbox(rows)
	if err != nil {
		return nil, fmt.Errorf("history: job %s: %w", id, err)
	}
	jobs, err := assemble(ctx, q, ors, []string{id})
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	j := jobs[0]
	if j.State == Pending || j.State == Running {
		if j.HeldBy, err = pause.Of(ctx, q, j.Kind); err != nil {
			return nil, err
		}
	}
	// A job's actions are few (each is an operator's), so all of them.
	if j.Actions, _, err = pause.Actions(ctx, q, j.ID, 0); err != nil {
		return nil, err
	}
	slices.Reverse(j.Actions)
	p, err := GetPayload(ctx, q, j.ID)
	if err != nil {
		return nil, err
	}
	j.Payload = &p
	return j, nil
}

// GetWorkflow reads the jobs request requestID started, as a tree.
func GetWorkflow(ctx context.Context, q outbox.Querier, requestID string) (*Workflow, error) {
	if requestID == "" {
		return nil, errors.New("history: a workflow needs a request id")
	}
	rows, err := q.Query(ctx, `SELECT `+outboxCols+` FROM outbox
		WHERE request_id = $1 ORDER BY id`, requestID)
	if err != nil {
		return nil, fmt.Errorf("history: workflow %s: %w", requestID, err)
	}
	ors, err := scanOutbox(rows)
	if err != nil {
		return nil, fmt.Errorf("history: workflow %s: %w", requestID, err)
	}
	// Jobs whose outbox rows were trimmed are still named by history.
	rows, err = q.Query(ctx, `SELECT DISTINCT job_id FROM job_history WHERE request_id = $1`, requestID)
	if err != nil {
		return nil, fmt.Errorf("history: workflow %s: %w", requestID, err)
	}
	extra, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("history: workflow %s: %w", requestID, err)
	}
	jobs, err := assemble(ctx, q, ors, extra)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("request %s: %w", requestID, ErrNotFound)
	}
	w := &Workflow{RequestID: requestID, Count: len(jobs), States: map[string]int{}}
	byID := make(map[string]*Job, len(jobs))
	for _, j := range jobs {
		byID[j.ID] = j
		w.States[j.State]++
	}
	for _, j := range jobs {
		if p := byID[j.Parent]; p != nil && p != j {
			p.Children = append(p.Children, j)
		} else {
			w.Jobs = append(w.Jobs, j)
		}
	}
	return w, nil
}

// assemble builds the jobs of ors (in the order their first rows came)
// plus those of ids with no outbox row, with their state, dead letters
// and history.
func assemble(ctx context.Context, q outbox.Querier, ors []outboxRow, ids []string) ([]*Job, error) {
	byID := map[string]*Job{}
	var jobs []*Job
	add := func(id string) *Job {
		if j := byID[id]; j != nil {
			return j
		}
		j := &Job{ID: id, State: Unknown, History: []Record{}}
		byID[id] = j
		jobs = append(jobs, j)
		return j
	}
	// lastAttempt is the highest attempt a job's rows, links or records
	// name; hasRow, the jobs with an outbox row left; settled, the jobs whose
	// state a row or a link gave.
	lastAttempt := map[string]int{}
	hasRow, settled := map[string]bool{}, map[string]bool{}
	for _, o := range ors {
		j := add(o.jobID)
		hasRow[o.jobID], settled[o.jobID] = true, true
		j.Kind, j.RequestID, j.Attempts, j.Priority = o.kind, o.requestID, j.Attempts+1, o.priority
		lastAttempt[o.jobID] = max(lastAttempt[o.jobID], o.attempt)
		if j.Parent == "" {
			j.Parent = o.parent
		}
		// Rows come in id order: the last one is the latest attempt.
		j.Outcome = o.outcome
		switch state, ended := endedAs(outcome.Outcome(o.outcome)); {
		case !o.published:
			j.State = Pending
		case !o.done:
			j.State = Running
		case ended:
			j.State = state
		default:
			// retry_scheduled or dead_letter: settled below from the
			// scheduled run or the dead letter.
			j.State = Running
		}
	}
	for _, id := range ids {
		add(id)
	}
	if len(jobs) == 0 {
		return nil, nil
	}
	all := make([]string, len(jobs))
	for i, j := range jobs {
		all[i] = j.ID
	}
	// What retention kept of a job's deleted rows (job_links): its parent,
	// and, for a job none of whose rows is left, the state, kind and
	// request its latest row gave it; its deleted rows count as attempts.
	rows, err := q.Query(ctx, `SELECT job_id, coalesce(parent_job_id, ''), coalesce(kind, ''), coalesce(request_id, ''),
		coalesce(outcome, ''), outcome IS NOT NULL, rows, attempt FROM job_links WHERE job_id = ANY($1)`, all)
	if err != nil {
		return nil, fmt.Errorf("history: links: %w", err)
	}
	if err := eachRow(rows, func(r pgx.Rows) error {
		var id, parent, kind, req, ended string
		var known bool
		var n, attempt int
		if err := r.Scan(&id, &parent, &kind, &req, &ended, &known, &n, &attempt); err != nil {
			return err
		}
		j := byID[id]
		if j.Parent == "" {
			j.Parent = parent
		}
		j.Attempts += n
		if attempt >= 0 {
			lastAttempt[id] = max(lastAttempt[id], attempt)
		}
		if !hasRow[id] && known {
			j.Kind, j.RequestID, j.Outcome = kind, req, ended
			j.State = Unknown
			if state, ok := endedAs(outcome.Outcome(ended)); ok {
				j.State = state
			}
			// retry_scheduled or dead_letter: settled below from the
			// scheduled run or the dead letter, if still kept.
			settled[id] = true
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("history: links: %w", err)
	}
	// A job born in the scheduler has no outbox row until it is due.
	rows, err = q.Query(ctx, `SELECT job_id, min(run_at), min(kind), min(request_id) FROM scheduled_jobs
		WHERE job_id = ANY($1) AND enqueued_at IS NULL GROUP BY job_id`, all)
	if err != nil {
		return nil, fmt.Errorf("history: scheduled runs: %w", err)
	}
	if err := eachRow(rows, func(r pgx.Rows) error {
		var id, kind, req string
		var at time.Time
		if err := r.Scan(&id, &at, &kind, &req); err != nil {
			return err
		}
		j := byID[id]
		j.State, j.RetryAt = WaitingToRetry, &at
		if j.Kind == "" {
			j.Kind, j.RequestID = kind, req
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("history: scheduled runs: %w", err)
	}
	// A job's latest letter not requeued is open, or discarded.
	rows, err = q.Query(ctx, `SELECT DISTINCT ON (job_id) job_id, id, kind, request_id, reason, discarded_at IS NOT NULL FROM dead_letters
		WHERE job_id = ANY($1) AND requeued_at IS NULL ORDER BY job_id, id DESC`, all)
	if err != nil {
		return nil, fmt.Errorf("history: dead letters: %w", err)
	}
	if err := eachRow(rows, func(r pgx.Rows) error {
		var id, kind, req, reason string
		var letter int64
		var discarded bool
		if err := r.Scan(&id, &letter, &kind, &req, &reason, &discarded); err != nil {
			return err
		}
		j := byID[id]
		j.State, j.DeadLetter, j.DeadLetterReason = DeadLetteredState, letter, reason
		if discarded {
			j.State = Discarded
		}
		if j.Kind == "" {
			j.Kind, j.RequestID = kind, req
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("history: dead letters: %w", err)
	}
	rows, err = q.Query(ctx, `SELECT id, job_id, kind, coalesce(outbox_id, 0), request_id, attempt, deliveries, stream_id,
		consumer, plugin, plugin_version, guard, verdict, reason, error, started_at, finished_at
		FROM job_history WHERE job_id = ANY($1) ORDER BY finished_at, id`, all)
	if err != nil {
		return nil, fmt.Errorf("history: records: %w", err)
	}
	if err := eachRow(rows, func(r pgx.Rows) error {
		var h Record
		if err := r.Scan(&h.ID, &h.JobID, &h.Kind, &h.OutboxID, &h.RequestID, &h.Attempt, &h.Deliveries, &h.StreamID,
			&h.Consumer, &h.Plugin, &h.PluginVersion, &h.Guard, &h.Verdict, &h.Reason, &h.Error, &h.StartedAt, &h.FinishedAt); err != nil {
			return err
		}
		h.TookMS = h.Duration().Milliseconds()
		j := byID[h.JobID]
		j.History = append(j.History, h)
		lastAttempt[h.JobID] = max(lastAttempt[h.JobID], h.Attempt)
		if h.Verdict == Absorbed {
			j.Absorbed++
		}
		if j.Kind == "" {
			j.Kind, j.RequestID = h.Kind, h.RequestID
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("history: records: %w", err)
	}
	// A job named by nothing but the caller's id does not exist.
	kept := jobs[:0]
	for _, j := range jobs {
		if j.Kind == "" {
			continue
		}
		if n, ok := lastAttempt[j.ID]; ok {
			j.Attempts = max(j.Attempts, n+1)
		}
		if j.State == Unknown && !settled[j.ID] {
			// Its rows went before retention kept what they said (or
			// it has none): its last record that settled a delivery
			// says how it ended, as a row's outcome would (an
			// abandoned delivery settles nothing: its entry ran
			// again). Any other verdict leaves it Unknown: a retry's
			// run or a dead letter would have been found, so what
			// followed it is no longer kept.
			for _, r := range slices.Backward(j.History) {
				if r.Verdict == Abandoned {
					continue
				}
				if state, ended := endedAs(r.Verdict); ended {
					j.State, j.Outcome = state, string(r.Verdict)
				}
				break
			}
		}
		kept = append(kept, j)
	}
	return kept, nil
}

// endedAs is the state of a job whose latest row or record ended with o,
// when o ends it: applied or absorbed is Done, cancelled is Cancelled.
func endedAs(o outcome.Outcome) (state string, ended bool) {
	switch o {
	case outcome.Applied, outcome.Absorbed:
		return Done, true
	case outcome.Cancelled:
		return Cancelled, true
	}
	return "", false
}

func eachRow(rows pgx.Rows, f func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
)

// ErrNotFound: no workflow of that type and id.
var ErrNotFound = errors.New("workflow: not found")

// States a workflow is in.
var States = []string{"running", "completed", "failed", "cancelled"}

// Summary is one workflow as `host workflows list` shows it.
type Summary struct {
	ID            int64           `json:"id"`
	Type          string          `json:"type"`
	WorkflowID    string          `json:"workflow_id"`
	State         string          `json:"state"`
	RequestID     string          `json:"request_id"`
	Plugin        string          `json:"plugin,omitempty"`
	PluginVersion string          `json:"plugin_version,omitempty"`
	Events        int64           `json:"events"`
	Result        json.RawMessage `json:"result,omitempty"`
	Error         string          `json:"error,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	FinishedAt    *time.Time      `json:"finished_at,omitempty"`
}

// Event is one recorded event.
type Event struct {
	Seq    int64           `json:"seq"`
	Type   string          `json:"type"`
	Name   string          `json:"name,omitempty"`
	Detail string          `json:"detail,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
	At     time.Time       `json:"at"`
}

// Workflow is one workflow with its history.
type Workflow struct {
	Summary
	Input  json.RawMessage `json:"input"`
	Events []Event         `json:"history"`
}

// Filter selects workflows to list; its zero value lists the newest.
type Filter struct {
	// Type and State, when set, match exactly.
	Type, State string
	// OlderThan, when positive, keeps workflows created at least that
	// long ago.
	OlderThan time.Duration
	// After, when set, is the id of the last workflow of the page before:
	// the list goes on with the ones listed after it (0: the first page).
	// A page after a workflow retention deleted is empty.
	After int64
	// Limit defaults to 100.
	Limit int
}

const summaryColumns = `id, type, workflow_id, state, request_id, coalesce(plugin, ''), coalesce(plugin_version, ''),
	last_seq, result::text, coalesce(error, ''), created_at, updated_at, finished_at`

// filtered is the condition of Filter's Type ($1), State ($2) and
// OlderThan ($3, seconds); listedAfter that of a workflow listed after the
// one of id $4 (newest first: created_at, then id, descending).
const (
	filtered    = `($1 = '' OR type = $1) AND ($2 = '' OR state = $2) AND created_at <= now() - make_interval(secs => $3)`
	listedAfter = `(created_at, id) < (SELECT created_at, id FROM workflows WHERE id = $4)`
)

func scanSummary(r pgx.Row) (Summary, error) {
	var s Summary
	var result *string
	err := r.Scan(&s.ID, &s.Type, &s.WorkflowID, &s.State, &s.RequestID, &s.Plugin, &s.PluginVersion,
		&s.Events, &result, &s.Error, &s.CreatedAt, &s.UpdatedAt, &s.FinishedAt)
	if result != nil {
		s.Result = json.RawMessage(*result)
	}
	return s, err
}

// List lists the workflows f selects, newest first, from f.After on.
func List(ctx context.Context, q outbox.Querier, f Filter) ([]Summary, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, `SELECT `+summaryColumns+` FROM workflows
		WHERE `+filtered+` AND ($4 = 0 OR `+listedAfter+`)
		ORDER BY created_at DESC, id DESC LIMIT $5`, f.Type, f.State, f.OlderThan.Seconds(), f.After, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("workflow: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Summary, error) { return scanSummary(r) })
	if err != nil {
		return nil, fmt.Errorf("workflow: list: %w", err)
	}
	return out, nil
}

// Count counts the workflows f selects (its Type, State and OlderThan):
// total, and before, how many of them List lists before f.After's page
// (0 for the first page), so a page is workflows before+1 to
// before+len(page) of total.
func Count(ctx context.Context, q outbox.Querier, f Filter) (total, before int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE $4 <> 0 AND NOT `+listedAfter+`) FROM workflows
		WHERE `+filtered, f.Type, f.State, f.OlderThan.Seconds(), f.After).Scan(&total, &before)
	if err != nil {
		return 0, 0, fmt.Errorf("workflow: count: %w", err)
	}
	return total, before, nil
}

// GetByRequestID returns the workflow whose tasks and steps carry request
// id (TYPE:ID), with its history.
func GetByRequestID(ctx context.Context, q outbox.Querier, requestID string) (*Workflow, error) {
	var input string
	s, err := scanSummary(rowWith{q.QueryRow(ctx, `SELECT `+summaryColumns+`, input::text FROM workflows WHERE request_id = $1`, requestID), &input})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("workflow: get %s: %w", requestID, err)
	}
	w := &Workflow{Summary: s, Input: json.RawMessage(input)}
	rows, err := q.Query(ctx, `SELECT seq, type, name, detail, data::text, at FROM workflow_events WHERE workflow = $1 ORDER BY seq`, w.ID)
	if err != nil {
		return nil, fmt.Errorf("workflow: history of %s: %w", requestID, err)
	}
	w.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		var data *string
		err := r.Scan(&e.Seq, &e.Type, &e.Name, &e.Detail, &data, &e.At)
		if data != nil {
			e.Data = json.RawMessage(*data)
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: history of %s: %w", requestID, err)
	}
	return w, nil
}

// RequestID is the request id a workflow's tasks and steps carry.
func RequestID(typ, id string) string { return typ + ":" + id }

// rowWith scans a row whose last columns go to more, after the summary's.
type rowWith struct {
	pgx.Row
	more *string
}

func (r rowWith) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.more)...) }

// Trim deletes up to limit finished workflows (completed, failed or
// cancelled) that finished before before, with their histories, steps,
// timers, signals and decisions, and returns how many it deleted. A running
// workflow is never deleted, however old (host/retention's Workflows
// window).
func Trim(ctx context.Context, q outbox.Querier, before time.Time, limit int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM workflows WHERE id IN (
		SELECT id FROM workflows WHERE state <> 'running' AND finished_at < $1 ORDER BY finished_at LIMIT $2)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("workflow: trim: %w", err)
	}
	return tag.RowsAffected(), nil
}

// BinaryGrace is how long a stored plugin version is kept after it was
// last loaded or swapped in, whatever is pinned to it: a decision in
// flight when it was swapped out may still pin a workflow to it.
const BinaryGrace = time.Hour

// TrimBinaries deletes the stored binaries (workflow_binaries) no running
// workflow is pinned to, except each plugin's newest and those loaded
// within BinaryGrace.
func TrimBinaries(ctx context.Context, q outbox.Querier) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM workflow_binaries b
		WHERE b.stored_at < now() - $1::interval
		  AND b.stored_at < (SELECT max(n.stored_at) FROM workflow_binaries n WHERE n.plugin = b.plugin)
		  AND NOT EXISTS (SELECT 1 FROM workflows w WHERE w.state = 'running' AND w.plugin = b.plugin AND w.plugin_version = b.version)`,
		BinaryGrace.String())
	if err != nil {
		return 0, fmt.Errorf("workflow: trim the stored binaries: %w", err)
	}
	return tag.RowsAffected(), nil
}

// StepStart marks workflow step jobID started, before a host runs its
// delivery, and reports whether it may run: false when the step was
// cancelled before it started (usher_workflow_step_start). From here on
// a cancel leaves the step to finish. A job that is no step may run.
func StepStart(ctx context.Context, q outbox.Querier, jobID string) (bool, error) {
	var run bool
	if err := q.QueryRow(ctx, `SELECT usher_workflow_step_start($1)`, jobID).Scan(&run); err != nil {
		return false, fmt.Errorf("workflow: step %s: start: %w", jobID, err)
	}
	return run, nil
}

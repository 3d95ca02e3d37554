package history

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
)

// Verdicts a record holds: how its delivery was settled (host/outcome,
// the vocabulary the outbox shares).
const (
	Applied      = outcome.Applied
	Absorbed     = outcome.Absorbed
	Retry        = outcome.RetryScheduled
	DeadLettered = outcome.DeadLettered
	Abandoned    = outcome.Abandoned
)

// Record is one delivery of a job.
type Record struct {
	ID            int64           `json:"id"`
	JobID         string          `json:"job_id"`
	Kind          string          `json:"kind"`
	OutboxID      int64           `json:"outbox_id,omitempty"`
	RequestID     string          `json:"request_id"`
	Attempt       int             `json:"attempt"`
	Deliveries    int             `json:"deliveries"`
	StreamID      string          `json:"stream_id"`
	Consumer      string          `json:"consumer"`
	Plugin        string          `json:"plugin"`
	PluginVersion string          `json:"plugin_version"`
	Guard         string          `json:"guard"`
	Verdict       outcome.Outcome `json:"verdict"`
	Reason        string          `json:"reason,omitempty"`
	Error         string          `json:"error,omitempty"`
	StartedAt     time.Time       `json:"started_at"`
	FinishedAt    time.Time       `json:"finished_at"`
	// TookMS is Duration in milliseconds, filled in when read.
	TookMS int64 `json:"took_ms"`
}

// Duration is how long the delivery ran.
func (r Record) Duration() time.Duration { return r.FinishedAt.Sub(r.StartedAt) }

// Write inserts r, finished now (r.FinishedAt is ignored). q is the host's
// pool or the transaction of the outcome it goes with. Text fields are
// stored as deadletter.Text makes them: an entry's bytes that are not
// valid text must not make its outcome unwritable.
func Write(ctx context.Context, q outbox.Querier, r Record) error {
	if r.JobID == "" || r.Kind == "" || r.Verdict == "" {
		return errors.New("history: a record needs a job id, a kind and a verdict")
	}
	var outboxID *int64
	if r.OutboxID > 0 {
		outboxID = &r.OutboxID
	}
	_, err := q.Exec(ctx, `INSERT INTO job_history (job_id, kind, outbox_id, request_id, attempt, deliveries, stream_id,
		consumer, plugin, plugin_version, guard, verdict, reason, error, started_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
		t(r.JobID), t(r.Kind), outboxID, t(r.RequestID), r.Attempt, r.Deliveries, t(r.StreamID), t(r.Consumer), t(r.Plugin),
		t(r.PluginVersion), t(r.Guard), t(string(r.Verdict)), t(r.Reason), t(r.Error), r.StartedAt)
	if err != nil {
		return fmt.Errorf("history: write %s job %s: %w", r.Kind, r.JobID, err)
	}
	return nil
}

func t(s string) string { return deadletter.Text(s) }

// Trim deletes the records finished before before, at most batch of them
// (so one pass holds no long lock), and returns how many it deleted.
func Trim(ctx context.Context, q outbox.Querier, before time.Time, batch int) (int64, error) {
	return trim(ctx, q, "job_history", "id", "finished_at", before, batch)
}

// TrimRepublishes deletes the records of republishes (job_republishes,
// written by the outbox's reconciler) made before before, at most batch of
// them, and returns how many it deleted. They are kept as long as the
// records of deliveries.
func TrimRepublishes(ctx context.Context, q outbox.Querier, before time.Time, batch int) (int64, error) {
	return trim(ctx, q, "job_republishes", "id", "republished_at", before, batch)
}

// TrimLinks deletes the parent links retention kept of jobs whose outbox
// rows it deleted (job_links) before before, at most batch of them, and
// returns how many it deleted: they are kept as long as the history.
func TrimLinks(ctx context.Context, q outbox.Querier, before time.Time, batch int) (int64, error) {
	return trim(ctx, q, "job_links", "job_id", "kept_at", before, batch)
}

// trim deletes up to batch rows of table whose column at is before before,
// oldest first, by their key.
func trim(ctx context.Context, q outbox.Querier, table, key, at string, before time.Time, batch int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM `+table+` WHERE `+key+` IN (
		SELECT `+key+` FROM `+table+` WHERE `+at+` < $1 ORDER BY `+at+` LIMIT $2)`, before, batch)
	if err != nil {
		return 0, fmt.Errorf("history: trim %s: %w", table, err)
	}
	return tag.RowsAffected(), nil
}

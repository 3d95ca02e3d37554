package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/internal/periodic"
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
	tag, err := q.Exec(ctx, `DELETE FROM job_history WHERE id IN (
		SELECT id FROM job_history WHERE finished_at < $1 ORDER BY finished_at LIMIT $2)`, before, batch)
	if err != nil {
		return 0, fmt.Errorf("history: trim: %w", err)
	}
	return tag.RowsAffected(), nil
}

// TrimmerConfig configures a Trimmer.
type TrimmerConfig struct {
	// Pool is the host's pool. Required.
	Pool *pgxpool.Pool
	// Retention is how long a record is kept. Default 7 days.
	Retention time.Duration
	// Interval between passes. Default 10 minutes.
	Interval time.Duration
	// Batch is the most records one statement deletes; a pass repeats it
	// until fewer are left. Default 10,000.
	Batch int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Trimmer deletes history older than its retention, periodically.
type Trimmer struct{ cfg TrimmerConfig }

// NewTrimmer validates cfg and fills its defaults.
func NewTrimmer(cfg TrimmerConfig) (*Trimmer, error) {
	if cfg.Pool == nil {
		return nil, errors.New("history: trimmer needs a pool")
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Minute
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 10_000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Trimmer{cfg: cfg}, nil
}

// Run trims every Interval until ctx is done.
func (t *Trimmer) Run(ctx context.Context) error {
	return periodic.Run(ctx, t.cfg.Interval, t.cfg.Logger, "job history trim failed", func(ctx context.Context) error {
		_, err := t.Pass(ctx)
		return err
	})
}

// Pass deletes every record older than the retention and returns how many.
func (t *Trimmer) Pass(ctx context.Context) (int64, error) {
	before := t.cfg.Now().Add(-t.cfg.Retention)
	var total int64
	for {
		n, err := Trim(ctx, t.cfg.Pool, before, t.cfg.Batch)
		total += n
		if err != nil || n < int64(t.cfg.Batch) {
			if total > 0 {
				t.cfg.Logger.Info("job history trimmed", "deleted", total, "retention", t.cfg.Retention)
			}
			return total, err
		}
	}
}

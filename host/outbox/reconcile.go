package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/internal/periodic"
	"github.com/usherhq/usher/host/outcome"
)

// Finish records how the job of outbox row id ended. The host calls it
// before acking the row's stream entry; a crash in between redelivers the
// entry, whose guard absorbs it and finishes the row again (a no-op).
func Finish(ctx context.Context, q Querier, id int64, o outcome.Outcome) error {
	if id <= 0 {
		return nil
	}
	if _, err := q.Exec(ctx, `UPDATE outbox SET done_at = now(), outcome = $2 WHERE id = $1 AND done_at IS NULL`, id, string(o)); err != nil {
		return fmt.Errorf("outbox: finish %d: %w", id, err)
	}
	return nil
}

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Pool is the Postgres pool. Required.
	Pool *pgxpool.Pool
	// StaleAfter is how long a published row may go without an outcome
	// before it is published again. It must be well above the longest
	// backlog the stream is expected to hold, since every row republished
	// is a duplicate delivery. Default 15 minutes.
	StaleAfter time.Duration
	// Interval between scans. Default 1 minute.
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Reconciler republishes outbox rows whose stream entry was lost. Redis
// holds the stream; if it loses entries (a restart without persistence, a
// failover that drops writes), the rows are marked published in Postgres
// and nothing would run them. The reconciler hands such rows back to the
// relay; at-least-once then holds with Postgres as the only source of truth.
type Reconciler struct {
	cfg ReconcilerConfig
}

// NewReconciler validates cfg and fills its defaults.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("outbox: reconciler needs Pool")
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 15 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Reconciler{cfg: cfg}, nil
}

// Run scans every Interval until ctx is done.
func (r *Reconciler) Run(ctx context.Context) error {
	return periodic.Run(ctx, r.cfg.Interval, r.cfg.Logger, "outbox reconcile failed", func(ctx context.Context) error {
		_, err := r.Reconcile(ctx)
		return err
	})
}

// Reconcile hands stale unfinished rows back to the relay and returns how
// many.
func (r *Reconciler) Reconcile(ctx context.Context) (int64, error) {
	tag, err := r.cfg.Pool.Exec(ctx, `
		UPDATE outbox SET published_at = NULL, republished = republished + 1
		WHERE done_at IS NULL AND published_at < now() - make_interval(secs => $1)
		  -- A host saw its entry lately, waiting for a host that serves its kind.
		  AND (kind_waited_at IS NULL OR kind_waited_at < now() - make_interval(secs => $1))
		  -- Its kind is paused (host/pause), or was resumed lately: its
		  -- entry waits in the stream, or drains now.
		  AND NOT EXISTS (SELECT 1 FROM kind_pauses p WHERE p.kind = outbox.kind
		      AND (p.resumed_at IS NULL OR p.resumed_at > now() - make_interval(secs => $1)))`, r.cfg.StaleAfter.Seconds())
	if err != nil {
		return 0, fmt.Errorf("outbox: reconcile: %w", err)
	}
	if n := tag.RowsAffected(); n > 0 {
		r.cfg.Logger.Warn("republishing outbox rows whose jobs never finished (stream entries lost?)",
			"rows", n, "stale_after", r.cfg.StaleAfter)
		if _, err := r.cfg.Pool.Exec(ctx, `SELECT pg_notify($1, '')`, Channel); err != nil {
			return n, err
		}
		return n, nil
	}
	return 0, nil
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/internal/periodic"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/stream"
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
	// Redis, Streams (the shards' keys) and Group: where the reconciler
	// reads the oldest entries still on the stream (stream.ReadOldest),
	// which decide which rows have lost theirs. Required.
	Redis   redis.UniversalClient
	Streams []string
	Group   string
	// Grace is how much older than the oldest entry still on the stream a
	// row must have been published to count as lost. A row's published_at
	// is its relay transaction's start and its entry is added before that
	// transaction commits, which the host's idle-in-transaction timeout
	// bounds; Grace must exceed it. Default 1 minute.
	Grace time.Duration
	// StaleAfter is the ceiling: a row published this long ago with no
	// outcome is published again even though an entry older than it is
	// still pending (a paused kind's parked entries, a job running for
	// ever), as long as no entry older than it is still undelivered (a
	// backlog republishes nothing). Default 15 minutes.
	StaleAfter time.Duration
	// Interval between scans. Default 10s.
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Reconciler republishes outbox rows whose stream entry was lost. Redis
// holds the stream; if it loses entries (a restart without persistence, a
// failover that drops writes), the rows are marked published in Postgres
// and nothing would run them. The reconciler hands such rows back to the
// relay; at-least-once then holds with Postgres as the only source of truth.
//
// Its window is read from the stream, not set: every entry stays on its
// shard, undelivered or pending, until its job's outcome has committed,
// so a row with no outcome that was published before every entry still
// there has lost its own. Such a row is republished Grace after the
// stream's oldest entry passed it, seconds to a minute after the loss
// when the hosts keep up, and a backlog of any length republishes
// nothing.
type Reconciler struct {
	cfg ReconcilerConfig
}

// NewReconciler validates cfg and fills its defaults.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if cfg.Pool == nil || cfg.Redis == nil || len(cfg.Streams) == 0 || cfg.Group == "" {
		return nil, errors.New("outbox: reconciler needs Pool, Redis, Streams and Group")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = time.Minute
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 15 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
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

// Window is how long ago a row with no outcome must have been published,
// as of now, to be published again: Grace more than the age of the oldest
// entry still pending (at most StaleAfter), and in any case Grace more
// than the age of the oldest entry still undelivered.
func (r *Reconciler) Window(o stream.Oldest) time.Duration {
	window := min(o.Pending+r.cfg.Grace, r.cfg.StaleAfter)
	if o.HasUndelivered {
		window = max(window, o.Undelivered+r.cfg.Grace)
	}
	return window
}

// Reconcile hands stale unfinished rows back to the relay and returns how
// many.
func (r *Reconciler) Reconcile(ctx context.Context) (int64, error) {
	oldest, err := stream.ReadOldest(ctx, r.cfg.Redis, r.cfg.Streams, r.cfg.Group)
	if err != nil {
		// Nothing can be republished to a Redis that does not answer.
		return 0, fmt.Errorf("outbox: reconcile: %w", err)
	}
	window := r.Window(oldest)
	// Each republish is recorded in job_republishes (the history the
	// console charts it from) in the same statement.
	tag, err := r.cfg.Pool.Exec(ctx, `
		WITH handed AS (UPDATE outbox SET published_at = NULL, republished = republished + 1
		WHERE done_at IS NULL AND published_at < now() - make_interval(secs => $1)
		  -- A host saw its entry lately, waiting for a host that serves its kind.
		  AND (kind_waited_at IS NULL OR kind_waited_at < now() - make_interval(secs => $2))
		  -- Its kind is paused (host/pause), or was resumed lately: its
		  -- entry waits in the stream, or drains now.
		  AND NOT EXISTS (SELECT 1 FROM kind_pauses p WHERE p.kind = outbox.kind
		      AND (p.resumed_at IS NULL OR p.resumed_at > now() - make_interval(secs => $2)))
		RETURNING id, coalesce(job_id, id::text) AS job_id, kind)
		INSERT INTO job_republishes (outbox_id, job_id, kind) SELECT id, job_id, kind FROM handed`,
		window.Seconds(), r.cfg.StaleAfter.Seconds())
	if err != nil {
		return 0, fmt.Errorf("outbox: reconcile: %w", err)
	}
	if n := tag.RowsAffected(); n > 0 {
		r.cfg.Logger.Warn("republishing outbox rows whose jobs never finished and whose stream entries are gone (lost by Redis?)",
			"rows", n, "published_before", window, "oldest_pending", oldest.Pending, "oldest_undelivered", oldest.Undelivered)
		if _, err := r.cfg.Pool.Exec(ctx, `SELECT pg_notify($1, '')`, Channel); err != nil {
			return n, err
		}
		return n, nil
	}
	return 0, nil
}

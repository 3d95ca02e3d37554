package workflow

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/internal/periodic"
)

// TimersConfig configures Timers.
type TimersConfig struct {
	// Pool is the host's pool. Required.
	Pool *pgxpool.Pool
	// Interval between scans for due timers. Default 500ms: a timer fires
	// within about that of its due time while a host runs.
	Interval time.Duration
	// BatchSize is how many due timers one transaction fires. Default 256.
	BatchSize int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Timers fires due workflow timers: each becomes a timer_fired event and
// (through usher_workflow_append) its workflow's next decision task, in
// one transaction, with FOR UPDATE SKIP LOCKED so several hosts share the
// work and none fires a timer twice. A sleeping workflow costs a row, no
// goroutine: this one loop scans an index of the unfired timers. A timer
// set in the past (at or before its decision's clock) fires at the next
// scan.
type Timers struct{ cfg TimersConfig }

// NewTimers validates cfg and fills its defaults.
func NewTimers(cfg TimersConfig) (*Timers, error) {
	if cfg.Pool == nil {
		return nil, errors.New("workflow: timers need a Pool")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Timers{cfg: cfg}, nil
}

// Run fires due timers until ctx is done.
func (t *Timers) Run(ctx context.Context) error {
	return periodic.Drain(ctx, t.cfg.Interval, t.cfg.Logger, "workflow timer scan failed", t.cfg.BatchSize, t.FireDue)
}

// FireDue fires one batch of due timers in one transaction and returns how
// many it fired.
func (t *Timers) FireDue(ctx context.Context) (int, error) {
	var n int
	err := t.cfg.Pool.QueryRow(ctx, `SELECT usher_workflow_fire_timers($1)`, t.cfg.BatchSize).Scan(&n)
	if err == nil && n > 0 {
		t.cfg.Logger.Debug("workflow timers fired", "n", n)
	}
	return n, err
}

// Package pause pauses and resumes a job kind across every host.
//
// The pause lives in Postgres (the kind_pauses table): Pause and Resume
// write it, each with a row in operator_actions saying who, when and what,
// in one transaction. Every host runs a Watcher that reads the paused kinds
// every Interval (default 1s) and answers Paused(kind) from memory, so a
// pause takes effect on every host within Interval plus the time a run
// already started takes to finish (a started run is never interrupted).
//
// While a kind is paused, the pipeline parks its deliveries as it parks
// those of a plugin that is not running: the entry stays pending in the
// stream, its delivery is given back (it does not count towards
// MaxDeliveries), nothing is dead-lettered, and the reconciler does not
// republish its outbox rows. After Resume, the entries this host's
// redispatcher waits for run within Interval (plus up to a second of its
// own polling); the others within the reclaim threshold.
package pause

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
)

// Paused is one paused kind.
type Paused struct {
	Kind     string    `json:"kind"`
	PausedAt time.Time `json:"paused_at"`
	PausedBy string    `json:"paused_by"`
	Reason   string    `json:"reason,omitempty"`
}

// Action is one operator action, as operator_actions holds it.
type Action struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	DBUser string    `json:"db_user"`
	Action string    `json:"action"`
	Target string    `json:"target"`
	Detail string    `json:"detail,omitempty"`
}

// The actions this package records.
const (
	ActionPause  = "pause_kind"
	ActionResume = "resume_kind"
)

// Beginner is what Pause and Resume need: *pgxpool.Pool, *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pause pauses kind on behalf of actor (who, as the tool names them:
// required) and records the action. It reports false, and records nothing,
// when kind was paused already; p is the pause in force either way.
func Pause(ctx context.Context, db Beginner, kind, actor, reason string) (p Paused, changed bool, err error) {
	if err := check(kind, actor); err != nil {
		return p, false, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO kind_pauses AS k (kind, paused_at, paused_by, reason) VALUES ($1, now(), $2, $3)
			ON CONFLICT (kind) DO UPDATE SET paused_at = now(), paused_by = $2, reason = $3, resumed_at = NULL, resumed_by = NULL
				WHERE k.resumed_at IS NOT NULL
			RETURNING kind, paused_at, paused_by, reason`, kind, actor, reason).Scan(&p.Kind, &p.PausedAt, &p.PausedBy, &p.Reason)
		if errors.Is(err, pgx.ErrNoRows) {
			return tx.QueryRow(ctx, `SELECT kind, paused_at, paused_by, reason FROM kind_pauses WHERE kind = $1`, kind).
				Scan(&p.Kind, &p.PausedAt, &p.PausedBy, &p.Reason)
		}
		if err != nil {
			return err
		}
		changed = true
		return record(ctx, tx, actor, ActionPause, kind, reason)
	})
	if err != nil {
		return p, false, fmt.Errorf("pause %s: %w", kind, err)
	}
	return p, changed, nil
}

// Resume resumes kind on behalf of actor and records the action. It
// reports false, and records nothing, when kind was not paused.
func Resume(ctx context.Context, db Beginner, kind, actor string) (changed bool, err error) {
	if err := check(kind, actor); err != nil {
		return false, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE kind_pauses SET resumed_at = now(), resumed_by = $2 WHERE kind = $1 AND resumed_at IS NULL`, kind, actor)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		changed = true
		return record(ctx, tx, actor, ActionResume, kind, "")
	})
	if err != nil {
		return false, fmt.Errorf("resume %s: %w", kind, err)
	}
	return changed, nil
}

func check(kind, actor string) error {
	switch {
	case kind == "":
		return errors.New("pause: name the kind")
	case actor == "":
		return errors.New("pause: name who acts")
	}
	return nil
}

func record(ctx context.Context, tx pgx.Tx, actor, action, target, detail string) error {
	_, err := tx.Exec(ctx, `INSERT INTO operator_actions (actor, action, target, detail) VALUES ($1, $2, $3, $4)`, actor, action, target, detail)
	return err
}

// List returns the paused kinds, by kind.
func List(ctx context.Context, q outbox.Querier) ([]Paused, error) {
	rows, err := q.Query(ctx, `SELECT kind, paused_at, paused_by, reason FROM kind_pauses WHERE resumed_at IS NULL ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("paused kinds: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Paused])
}

// Of returns the pause in force on kind, nil when kind runs.
func Of(ctx context.Context, q outbox.Querier, kind string) (*Paused, error) {
	rows, err := q.Query(ctx, `SELECT kind, paused_at, paused_by, reason FROM kind_pauses WHERE kind = $1 AND resumed_at IS NULL`, kind)
	if err != nil {
		return nil, fmt.Errorf("pause of %s: %w", kind, err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Paused])
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	return &ps[0], nil
}

// Actions returns the operator actions on target (every target when
// empty), newest first, at most limit (every one when limit is 0), and
// how many there are in all.
func Actions(ctx context.Context, q outbox.Querier, target string, limit int) ([]Action, int, error) {
	rows, err := q.Query(ctx, `SELECT id, at, actor, db_user::text, action, target, detail, count(*) OVER () FROM operator_actions
		WHERE $1 = '' OR target = $1 ORDER BY id DESC LIMIT NULLIF($2, 0)`, target, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("operator actions: %w", err)
	}
	var total int
	as, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Action, error) {
		var a Action
		err := row.Scan(&a.ID, &a.At, &a.Actor, &a.DBUser, &a.Action, &a.Target, &a.Detail, &total)
		return a, err
	})
	return as, total, err
}

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Pool reads kind_pauses. Required.
	Pool outbox.Querier
	// Interval between reads: how long a pause or resume takes to reach
	// this host at most. Default 1s.
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Watcher caches the paused kinds for the pipeline.
type Watcher struct {
	cfg    WatcherConfig
	paused atomic.Pointer[map[string]bool]
}

// NewWatcher validates cfg and fills its defaults.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pause: watcher needs Pool")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Watcher{cfg: cfg}, nil
}

// Paused reports whether kind was paused at the last read. Before the
// first read, nothing is.
func (w *Watcher) Paused(kind string) bool {
	m := w.paused.Load()
	return m != nil && (*m)[kind]
}

// Run reads the paused kinds, reports started, then reads them every
// Interval until ctx is done. A failed read keeps the last set (logged);
// a first read that fails starts with none paused.
func (w *Watcher) Run(ctx context.Context, started func()) error {
	if err := w.Read(ctx); err != nil && ctx.Err() == nil {
		w.cfg.Logger.Warn("could not read the paused kinds; none paused until a read succeeds", "err", err)
	}
	started()
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := w.Read(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Warn("could not read the paused kinds; the last read stands", "err", err)
		}
	}
}

// Read reads the paused kinds now.
func (w *Watcher) Read(ctx context.Context) error {
	list, err := List(ctx, w.cfg.Pool)
	if err != nil {
		return err
	}
	m := make(map[string]bool, len(list))
	for _, p := range list {
		m[p.Kind] = true
	}
	if old := w.paused.Swap(&m); old != nil && !sameKeys(*old, m) {
		w.cfg.Logger.Info("paused kinds changed", "paused", len(m))
	}
	return nil
}

func sameKeys(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

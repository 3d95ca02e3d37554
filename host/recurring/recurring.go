// Package recurring is the runtime's recurring schedules: a cron or
// interval schedule that starts a workflow or enqueues a job once per tick,
// across every host (migrations/00054_schedules.sql). An operator adds,
// lists, pauses, resumes and deletes them (host schedules); every host runs
// a Ticker, and whichever takes a due schedule fires its ticks in one
// transaction with the move of its next_at, so each tick fires once. A
// tick's workflow id (or job deduplication key) is NAME@TICK, so even a
// tick fired again would start nothing twice.
package recurring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/usherhq/usher/internal/jobmsg"
	"github.com/usherhq/usher/internal/wfmsg"
)

// Targets: what a tick does.
const (
	Workflow = "workflow"
	Job      = "job"
)

// Catch-up policies: what a schedule due more than once fires (its hosts
// were down, or it was late).
const (
	// CatchUpAll fires every missed tick (at most MaxTicksPerPass a pass).
	CatchUpAll = "all"
	// CatchUpOne fires the latest missed tick and skips the others.
	CatchUpOne = "one"
	// CatchUpSkip fires a tick less than SkipLate late, and none older.
	CatchUpSkip = "skip"
)

// Limits.
const (
	// MinEvery is the shortest interval.
	MinEvery = time.Second
	// MaxTicksPerPass bounds the ticks one schedule fires in one pass
	// (catch-up all); the next pass fires the rest.
	MaxTicksPerPass = 1000
	// SkipLate is how late a tick may be under CatchUpSkip and still fire.
	SkipLate = time.Minute
	// DedupWindow is how long a job tick's deduplication key holds.
	DedupWindow = 7 * 24 * time.Hour
)

// Schedule is one recurring schedule.
type Schedule struct {
	Name string `json:"name"`
	// Target is Workflow or Job; What the workflow type or the job's
	// kind; Input the workflow's input or the job's payload (JSON).
	Target string          `json:"target"`
	What   string          `json:"what"`
	Input  json.RawMessage `json:"input"`
	// Exactly one of Cron (a standard 5-field spec or a descriptor such
	// as @hourly, in UTC unless it starts with CRON_TZ=) and Every. In
	// JSON Every is every_ns, in nanoseconds, as the project names its
	// durations (it was "every", a number that did not say its unit).
	Cron    string        `json:"cron,omitempty"`
	Every   time.Duration `json:"every_ns,omitempty"`
	CatchUp string        `json:"catch_up"`
	Paused  bool          `json:"paused"`
	// NextAt is the next tick; LastTick the last fired; Fired and
	// Skipped count the ticks fired and skipped by the catch-up policy.
	NextAt   time.Time  `json:"next_at"`
	LastTick *time.Time `json:"last_tick,omitempty"`
	Fired    int64      `json:"fired"`
	Skipped  int64      `json:"skipped"`
}

// next is the tick after t.
func (s Schedule) next(t time.Time) (time.Time, error) {
	if s.Every > 0 {
		return t.Add(s.Every), nil
	}
	spec, err := cron.ParseStandard(s.Cron)
	if err != nil {
		return time.Time{}, fmt.Errorf("schedule %s: cron %q: %w", s.Name, s.Cron, err)
	}
	n := spec.Next(t.UTC())
	if n.IsZero() {
		return time.Time{}, fmt.Errorf("schedule %s: cron %q has no tick after %s", s.Name, s.Cron, t.UTC().Format(time.RFC3339))
	}
	return n, nil
}

// Check refuses a schedule Add would refuse, with why.
func (s *Schedule) Check() error {
	if err := wfmsg.CheckName("schedule name", s.Name, wfmsg.MaxTypeBytes); err != nil {
		return err
	}
	if len(s.Input) == 0 {
		s.Input = json.RawMessage("null")
	}
	switch s.Target {
	case Workflow:
		if err := wfmsg.CheckStart(s.What, s.Name+"@2006-01-02T15:04:05Z", s.Input); err != nil {
			return fmt.Errorf("schedule %s: %w", s.Name, err)
		}
	case Job:
		if err := jobmsg.Check(s.What, s.Input, "", "", ""); err != nil {
			return fmt.Errorf("schedule %s: %w", s.Name, err)
		}
	default:
		return fmt.Errorf("schedule %s: the target is %q or %q, not %q", s.Name, Workflow, Job, s.Target)
	}
	switch {
	case (s.Cron == "") == (s.Every == 0):
		return fmt.Errorf("schedule %s: give a cron spec or an interval, one of them", s.Name)
	case s.Every != 0 && s.Every < MinEvery:
		return fmt.Errorf("schedule %s: an interval of %s is under the %s minimum", s.Name, s.Every, MinEvery)
	}
	if s.Cron != "" {
		if _, err := cron.ParseStandard(s.Cron); err != nil {
			return fmt.Errorf("schedule %s: cron %q: %w", s.Name, s.Cron, err)
		}
	}
	switch s.CatchUp {
	case "":
		s.CatchUp = CatchUpOne
	case CatchUpAll, CatchUpOne, CatchUpSkip:
	default:
		return fmt.Errorf("schedule %s: catch-up is %q, %q or %q, not %q", s.Name, CatchUpAll, CatchUpOne, CatchUpSkip, s.CatchUp)
	}
	return nil
}

// ErrExists is Add's error for a name taken.
var ErrExists = errors.New("a schedule of that name exists")

// Add creates schedule s, its first tick the first after now (or s.NextAt
// when set).
func Add(ctx context.Context, pool *pgxpool.Pool, s Schedule, now time.Time) (Schedule, error) {
	if err := s.Check(); err != nil {
		return s, err
	}
	if s.NextAt.IsZero() {
		n, err := s.next(now)
		if err != nil {
			return s, err
		}
		s.NextAt = n
	}
	tag, err := pool.Exec(ctx, `INSERT INTO schedules (name, target, what, input, cron, every, catch_up, paused, next_at)
		VALUES ($1, $2, $3, $4::jsonb, nullif($5, ''), $6, $7, $8, $9) ON CONFLICT (name) DO NOTHING`,
		s.Name, s.Target, s.What, string(s.Input), s.Cron, every(s.Every), s.CatchUp, s.Paused, s.NextAt)
	if err != nil {
		return s, fmt.Errorf("schedule %s: %w", s.Name, err)
	}
	if tag.RowsAffected() == 0 {
		return s, fmt.Errorf("schedule %s: %w (delete it first)", s.Name, ErrExists)
	}
	return s, nil
}

func every(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

const columns = `name, target, what, input::text, coalesce(cron, ''), coalesce(every, '0'), catch_up, paused, next_at, last_tick, fired, skipped`

func scan(row pgx.Row) (Schedule, error) {
	var s Schedule
	var input string
	err := row.Scan(&s.Name, &s.Target, &s.What, &input, &s.Cron, &s.Every, &s.CatchUp, &s.Paused, &s.NextAt, &s.LastTick,
		&s.Fired, &s.Skipped)
	s.Input = json.RawMessage(input)
	return s, err
}

// List lists the schedules by name.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Schedule, error) {
	rows, err := pool.Query(ctx, `SELECT `+columns+` FROM schedules ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Schedule, error) { return scan(r) })
}

// ErrNoSchedule is the error for a name no schedule has.
var ErrNoSchedule = errors.New("no such schedule")

// SetPaused pauses or resumes schedule name. Ticks due while it was paused
// are skipped: a resumed schedule's next tick is the first after now.
func SetPaused(ctx context.Context, pool *pgxpool.Pool, name string, paused bool, now time.Time) (Schedule, error) {
	var out Schedule
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		s, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM schedules WHERE name = $1 FOR UPDATE`, name))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("schedule %s: %w", name, ErrNoSchedule)
		}
		if err != nil {
			return err
		}
		next := s.NextAt
		if !paused && s.Paused {
			for next.Before(now) || next.Equal(now) {
				if next, err = s.next(next); err != nil {
					return err
				}
			}
		}
		s.Paused, s.NextAt = paused, next
		out = s
		_, err = tx.Exec(ctx, `UPDATE schedules SET paused = $2, next_at = $3, updated_at = now() WHERE name = $1`, name, paused, next)
		return err
	})
	return out, err
}

// Delete deletes schedule name. What its ticks started runs on.
func Delete(ctx context.Context, pool *pgxpool.Pool, name string) error {
	tag, err := pool.Exec(ctx, `DELETE FROM schedules WHERE name = $1`, name)
	if err == nil && tag.RowsAffected() == 0 {
		err = fmt.Errorf("schedule %s: %w", name, ErrNoSchedule)
	}
	return err
}

// TickerConfig configures a Ticker.
type TickerConfig struct {
	// Pool is the host's pool (the runtime's owner). Required.
	Pool *pgxpool.Pool
	// Interval between scans for due schedules. Default 1s.
	Interval time.Duration
	// Batch is how many due schedules one transaction takes. Default 32.
	Batch int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Ticker fires due schedules.
type Ticker struct{ cfg TickerConfig }

// NewTicker validates cfg and fills its defaults.
func NewTicker(cfg TickerConfig) (*Ticker, error) {
	if cfg.Pool == nil {
		return nil, errors.New("recurring: a ticker needs a Pool")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 32
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Ticker{cfg: cfg}, nil
}

// Run fires due schedules every Interval until ctx is done.
func (t *Ticker) Run(ctx context.Context) error {
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		for {
			n, err := t.Fire(ctx)
			if err != nil && ctx.Err() == nil {
				t.cfg.Logger.Warn("schedule scan failed", "err", err)
			}
			if err != nil || n < t.cfg.Batch {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Fire takes up to Batch due schedules and fires their ticks, in one
// transaction, and returns how many schedules it took.
func (t *Ticker) Fire(ctx context.Context) (int, error) {
	now := t.cfg.Now()
	var n int
	err := pgx.BeginFunc(ctx, t.cfg.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+columns+` FROM schedules WHERE NOT paused AND next_at <= $1
			ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED`, now, t.cfg.Batch)
		if err != nil {
			return err
		}
		due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Schedule, error) { return scan(r) })
		if err != nil {
			return err
		}
		n = len(due)
		for _, s := range due {
			if err := t.fire(ctx, tx, s, now); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// fire fires s's ticks due at now under its catch-up policy and moves its
// next tick past them (under CatchUpAll, past the ticks it fired: at most
// MaxTicksPerPass a pass).
func (t *Ticker) fire(ctx context.Context, tx pgx.Tx, s Schedule, now time.Time) error {
	var fire []time.Time
	var missed int64
	next := s.NextAt
	for !next.After(now) {
		if s.CatchUp == CatchUpAll && len(fire) == MaxTicksPerPass {
			break
		}
		if s.Every > 0 && s.CatchUp != CatchUpAll {
			// Straight to the last tick due: a year of a 1s interval is
			// no loop.
			k := int64(now.Sub(next) / s.Every)
			missed += k + 1
			fire = []time.Time{next.Add(time.Duration(k) * s.Every)}
			next = fire[0].Add(s.Every)
			break
		}
		missed++
		if s.CatchUp == CatchUpAll {
			fire = append(fire, next)
		} else {
			fire = []time.Time{next}
		}
		var err error
		if next, err = s.next(next); err != nil {
			return err
		}
	}
	if s.CatchUp == CatchUpSkip && len(fire) > 0 && now.Sub(fire[0]) >= SkipLate {
		fire = nil
	}
	for _, tick := range fire {
		id := s.Name + "@" + tick.UTC().Format(time.RFC3339)
		var err error
		switch s.Target {
		case Workflow:
			_, err = tx.Exec(ctx, `SELECT usher_start_workflow($1, $2, $3::jsonb)`, s.What, id, string(s.Input))
		case Job:
			_, err = tx.Exec(ctx, `SELECT usher_enqueue_job($1, $2::jsonb, $3, usher_workflow_traceparent(), $4, $5::interval)`,
				s.What, string(s.Input), "schedule:"+id, id, DedupWindow.String())
		}
		if err != nil {
			return fmt.Errorf("schedule %s, tick %s: %w", s.Name, tick.UTC().Format(time.RFC3339), err)
		}
	}
	var last *time.Time
	if len(fire) > 0 {
		last = &fire[len(fire)-1]
	}
	skipped := missed - int64(len(fire))
	_, err := tx.Exec(ctx, `UPDATE schedules SET next_at = $2, last_tick = coalesce($3, last_tick), fired = fired + $4,
		skipped = skipped + $5, updated_at = now() WHERE name = $1`, s.Name, next, last, len(fire), skipped)
	if err == nil && len(fire) > 0 {
		t.cfg.Logger.Debug("schedule fired", "schedule", s.Name, "ticks", len(fire), "skipped", skipped, "next", next)
	}
	return err
}

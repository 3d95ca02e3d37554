package jobctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
)

// CancelChannel is the LISTEN/NOTIFY channel usher_cancel_job notifies
// when it records the cancel of a job on the stream (its payload the
// job's id).
const CancelChannel = "usher_job_cancels"

// StreamCancels returns the ids of the jobs whose cancel was asked while
// their entry was on the stream and still stands: every request in
// job_cancels but those whose job ended otherwise since (a row of the job
// from the one the request named on, applied, absorbed or dead-lettered:
// a duplicate of an applied job is its guard's to absorb, a requeued dead
// letter runs). A job settled cancelled stays in: a redelivery of its
// entry must not run it either. Retention bounds the table.
func StreamCancels(ctx context.Context, q outbox.Querier) ([]string, error) {
	ended := []string{string(outcome.Applied), string(outcome.Absorbed), string(outcome.DeadLettered)}
	rows, err := q.Query(ctx, `
		SELECT c.job_id FROM job_cancels c
		WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = c.outbox_id AND o.outcome = ANY($1))
		  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = c.job_id AND o.id > c.outbox_id AND o.outcome = ANY($1))`, ended)
	if err != nil {
		return nil, fmt.Errorf("cancels on the stream: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// CancelWatcherConfig configures a CancelWatcher.
type CancelWatcherConfig struct {
	// Pool reads job_cancels and holds the LISTEN session (a connection
	// of its own, taken from the pool for as long as Run runs). Required.
	Pool *pgxpool.Pool
	// Interval between reads when no notification comes (a lost LISTEN
	// session, a notification missed while it reconnected): how long a
	// cancel takes to reach this host at most. Default 1s.
	Interval time.Duration
	// OnRead, when set, is told after each read how many cancels stand.
	OnRead func(n int)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// CancelWatcher holds, for the pipeline, the jobs cancelled while their
// entries were on the stream (StreamCancels): read at start, again as
// soon as a cancel is notified (CancelChannel), and every Interval. The
// pipeline asks Cancelled for every delivery, a map lookup; nothing per
// job reaches the database.
type CancelWatcher struct {
	cfg CancelWatcherConfig
	set atomic.Pointer[map[string]struct{}]
}

// NewCancelWatcher validates cfg and fills its defaults.
func NewCancelWatcher(cfg CancelWatcherConfig) (*CancelWatcher, error) {
	if cfg.Pool == nil {
		return nil, errors.New("jobctl: cancel watcher needs Pool")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &CancelWatcher{cfg: cfg}, nil
}

// Cancelled reports whether job id's cancel stood at the last read.
// Before the first read, none does.
func (w *CancelWatcher) Cancelled(id string) bool {
	m := w.set.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[id]
	return ok
}

// Run reads the cancels, reports started, then reads them on every
// notification and every Interval until ctx is done. A failed read keeps
// the last set (logged); a first read that fails starts with none.
func (w *CancelWatcher) Run(ctx context.Context, started func()) error {
	if err := w.Read(ctx); err != nil && ctx.Err() == nil {
		w.cfg.Logger.Warn("could not read the cancels of jobs on the stream; none held until a read succeeds", "err", err)
	}
	started()
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() { w.listen(ctx, wake) })
	defer wg.Wait()
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-wake:
		}
		if err := w.Read(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Warn("could not read the cancels of jobs on the stream; the last read stands", "err", err)
		}
	}
}

// Read reads the cancels now.
func (w *CancelWatcher) Read(ctx context.Context) error {
	ids, err := StreamCancels(ctx, w.cfg.Pool)
	if err != nil {
		return err
	}
	m := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		m[id] = struct{}{}
	}
	if old := w.set.Swap(&m); old != nil {
		for id := range m {
			if _, ok := (*old)[id]; !ok {
				w.cfg.Logger.Info("cancel of a job on the stream heard: no delivery of it runs here from now on", "job_id", id)
			}
		}
	}
	if w.cfg.OnRead != nil {
		w.cfg.OnRead(len(m))
	}
	return nil
}

// listen wakes Run on every notification, and once each time its session
// is (re)established: a cancel committed while it was down is read then.
func (w *CancelWatcher) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := w.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		w.cfg.Logger.Warn("cancel listener lost; reading every interval until it is back", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.cfg.Interval):
		}
	}
}

func (w *CancelWatcher) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := w.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A LISTENing connection must not go back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+CancelChannel); err != nil {
		return err
	}
	for {
		select {
		case wake <- struct{}{}:
		default:
		}
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
	}
}

// Package jobctl is what an operator does to one job or dead letter:
// cancel a job no host has started, run a scheduled job now, discard a
// dead letter, requeue a chosen set of dead letters. The CLI (`host jobs
// cancel|run-now`, `host deadletters discard|requeue`), the admin API and
// the console all call these functions. Each action commits with its row
// in operator_actions (who, when, what; its target is the job's id, so
// `host jobs show` and the console's job page list it with the job's
// deliveries), in one transaction.
//
// Cancel is final while a job waits where no host can have it (a
// scheduled run, an outbox row the relay has not published: the cancel
// and the scheduler or relay take the same row lock), so a job is never
// both cancelled and run. A job whose entry is on the stream is cancelled
// by request (job_cancels, notified to every host at commit): each host
// holds the requests in memory (CancelWatcher) and settles a requested
// job's delivery as cancelled instead of running it, with no write or
// query per job. That is not exact: a host that started the job before
// the request reached it (within milliseconds by the notification, a
// second at most by the watcher's poll) lets the run finish under its
// guard, and the job's outcome then says applied; `host jobs show` tells
// which. Telling the two apart exactly would cost every job a write before
// it runs, which only workflow steps pay (Start).
package jobctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/pause"
)

// The actions this package records in operator_actions.
const (
	ActionCancel  = "cancel_job"
	ActionRunNow  = "run_job_now"
	ActionDiscard = "discard_dead_letter"
	ActionRequeue = "requeue_dead_letter"
	// ActionRollback is a plugin rolled back by an operator (its target
	// the plugin's name), recorded by the admin API and the console.
	ActionRollback = "rollback_plugin"
)

// Where a cancelled job was waiting (usher_cancel_job).
const (
	// WasScheduled: a scheduled run, not yet moved to the outbox.
	WasScheduled = "scheduled"
	// WasPending: an outbox row the relay had not published.
	WasPending = "pending"
	// WasStream: its entry was on the stream; the cancel is a request
	// every host heeds from when it hears it (CancelWatcher). A run a host
	// started before finishes under its guard.
	WasStream = "stream"
	// WasCancelled: it was cancelled before; nothing changed.
	WasCancelled = "already"
)

// Beginner is what the actions need: *pgxpool.Pool, *pgx.Conn.
type Beginner = pause.Beginner

// Cancelled is what Cancel did.
type Cancelled struct {
	JobID string `json:"job_id"`
	// Was is where the job waited (WasScheduled, WasPending, WasStream),
	// or WasCancelled when it was cancelled before and nothing was
	// recorded.
	Was string `json:"was"`
}

// String says what the cancel did, as the CLI and the console say it.
func (c Cancelled) String() string {
	switch c.Was {
	case WasCancelled:
		return fmt.Sprintf("job %s was cancelled before: nothing more recorded", c.JobID)
	case WasScheduled:
		return fmt.Sprintf("cancelled job %s: its scheduled run never runs", c.JobID)
	case WasStream:
		return fmt.Sprintf("cancel requested for job %s on the stream: no host will start it from now on; a run already started finishes under its guard; `host jobs show %s` tells which", c.JobID, c.JobID)
	}
	return fmt.Sprintf("cancelled job %s: it was not published, and never will be", c.JobID)
}

// Cancel cancels job id before any host has started it, on behalf of
// actor (who, as the tool names them: required), with reason. A job on
// the stream is cancelled by request (WasStream): a run a host started
// before it heard finishes under its guard. It fails, with why, for a job
// that does not exist, has started (a start mark says so), ended, is
// dead-lettered, or belongs to a workflow.
func Cancel(ctx context.Context, db Beginner, id, actor, reason string) (Cancelled, error) {
	c := Cancelled{JobID: id}
	if err := check(id, actor); err != nil {
		return c, err
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT usher_cancel_job($1, $2)`, id, reason).Scan(&c.Was); err != nil {
			return err
		}
		if c.Was == WasCancelled {
			return nil
		}
		return record(ctx, tx, actor, ActionCancel, id, strings.TrimSpace("was "+c.Was+"; "+reason))
	})
	if err != nil {
		return c, fmt.Errorf("cancel job %s: %w", id, plain(err))
	}
	return c, nil
}

// RunNow makes job id's scheduled run due now, on behalf of actor, and
// returns when it was due. The scheduler moves it to the outbox at its
// next scan (every 500ms by default). It fails for a job with no
// scheduled run waiting.
func RunNow(ctx context.Context, db Beginner, id, actor string) (was time.Time, err error) {
	if err := check(id, actor); err != nil {
		return was, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT usher_run_job_now($1)`, id).Scan(&was); err != nil {
			return err
		}
		return record(ctx, tx, actor, ActionRunNow, id, "was due "+was.UTC().Format(time.RFC3339))
	})
	if err != nil {
		return was, fmt.Errorf("run job %s now: %w", id, plain(err))
	}
	return was, nil
}

// Discard closes open dead letter id, on behalf of actor, with reason: it
// is kept (its job's history shows it) but no longer open, and nothing
// requeues it. It returns the letter's job id.
func Discard(ctx context.Context, db Beginner, id int64, actor, reason string) (jobID string, err error) {
	if err := check(strconv.FormatInt(id, 10), actor); err != nil {
		return "", err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT usher_discard_dead_letter($1, $2)`, id, reason).Scan(&jobID); err != nil {
			return err
		}
		return record(ctx, tx, actor, ActionDiscard, jobID, strings.TrimSpace(fmt.Sprintf("dead letter %d; %s", id, reason)))
	})
	if err != nil {
		return "", fmt.Errorf("discard dead letter %d: %w", id, plain(err))
	}
	return jobID, nil
}

// Requeue puts the open dead letters ids back through the outbox with
// their identities kept (deadletter.RequeueIDs), on behalf of actor, all
// or none: an id that is not an open letter fails the whole set, named.
// It returns the requeued letters' job ids, in the order of ids.
func Requeue(ctx context.Context, db Beginner, ids []int64, actor string) (jobIDs []string, err error) {
	if err := check("requeue", actor); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errors.New("requeue: name at least one dead letter")
	}
	return requeue(ctx, db, actor, func(tx pgx.Tx) ([]deadletter.Requeued, error) { return deadletter.RequeueIDs(ctx, tx, ids) })
}

// RequeueKind puts every open dead letter of kind back as Requeue does,
// on behalf of actor, and returns their job ids.
//
// A kind that no dead letter has ever had is an error (a misspelt kind
// would otherwise requeue nothing and look done); a kind whose letters
// are all requeued or discarded requeues none, without error.
func RequeueKind(ctx context.Context, db Beginner, kind, actor string) (jobIDs []string, err error) {
	if err := check(kind, actor); err != nil {
		return nil, err
	}
	return requeue(ctx, db, actor, func(tx pgx.Tx) ([]deadletter.Requeued, error) {
		letters, err := deadletter.RequeueKind(ctx, tx, kind)
		if err != nil || len(letters) > 0 {
			return letters, err
		}
		var known bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dead_letters WHERE kind = $1)`, kind).Scan(&known); err != nil {
			return nil, err
		}
		if !known {
			return nil, fmt.Errorf("no dead letter was ever of kind %q: is the kind right? (host deadletters list shows the open ones)", kind)
		}
		return nil, nil
	})
}

func requeue(ctx context.Context, db Beginner, actor string, put func(pgx.Tx) ([]deadletter.Requeued, error)) (jobIDs []string, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		letters, err := put(tx)
		if err != nil {
			return err
		}
		for _, l := range letters {
			if err := record(ctx, tx, actor, ActionRequeue, l.JobID, fmt.Sprintf("dead letter %d", l.ID)); err != nil {
				return err
			}
			jobIDs = append(jobIDs, l.JobID)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("requeue: %w", plain(err))
	}
	return jobIDs, nil
}

// ParseIDs reads dead letter ids as the CLI and the console take them:
// positive integers, each once.
func ParseIDs(args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(strings.TrimSpace(a), 10, 64)
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("%q is not a dead letter ID", a)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func check(target, actor string) error {
	switch {
	case strings.TrimSpace(target) == "":
		return errors.New("name the job")
	case actor == "":
		return errors.New("name who acts")
	}
	return nil
}

// Record records an action done elsewhere (a plugin's rollback, which
// the fleet does in memory) in operator_actions.
func Record(ctx context.Context, db Beginner, actor, action, target, detail string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return record(ctx, tx, actor, action, target, detail) })
}

func record(ctx context.Context, tx pgx.Tx, actor, action, target, detail string) error {
	_, err := tx.Exec(ctx, `INSERT INTO operator_actions (actor, action, target, detail) VALUES ($1, $2, $3, $4)`, actor, action, target, detail)
	return err
}

// plain is a refusal raised by the functions as its message alone: it is
// the answer an operator reads, not a database failure.
func plain(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "55000" || pg.Code == "P0002" || pg.Code == "22023" || pg.Code == "54000") {
		return errors.New(pg.Message)
	}
	return err
}

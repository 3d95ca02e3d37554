// Package settle writes how every delivery of a job ended: applied (when
// not already written in the job's own transaction), absorbed, retry
// scheduled, dead-lettered, abandoned. Each outcome is one transaction on
// the host's pool holding everything it writes (the delayed run or the dead
// letter, the outbox row's mark, the delivery's history record), so they
// commit together or not at all. It also keeps the absorbed-duplicate
// counts. It owns no loop and reads no stream: the job pipeline calls it,
// and an entry is acked only after its settlement committed.
package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
)

// Timeout bounds one settlement's transaction. It runs under a context
// that outlives the job's: a job cancelled at shutdown still settles.
const Timeout = 10 * time.Second

// Config configures a Settler.
type Config struct {
	// Pool is the host's pool (the runtime owner's login). Required.
	Pool *pgxpool.Pool
	// Consumer is this host's consumer name, written in every record.
	// Required.
	Consumer string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Settler writes outcomes.
type Settler struct{ cfg Config }

// New validates cfg and fills its defaults.
func New(cfg Config) (*Settler, error) {
	if cfg.Pool == nil || cfg.Consumer == "" {
		return nil, errors.New("settle: needs a Pool and a Consumer")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Settler{cfg: cfg}, nil
}

// Delivery is one delivery of a job while it runs: its history record,
// whose verdict is filled in where it is decided.
type Delivery struct {
	Record history.Record
	// arrived and committed are the entry's Arrived and Committed
	// (stream.Entry).
	arrived, committed func()
}

// NewDelivery starts the record of e's delivery to consumer.
func NewDelivery(e stream.Entry, consumer string) *Delivery {
	return &Delivery{Record: history.Record{JobID: e.JobID, Kind: e.Kind, OutboxID: e.OutboxID, RequestID: e.RequestID,
		Attempt: e.Attempt, Deliveries: int(e.Deliveries), StreamID: e.StreamID, Consumer: consumer, StartedAt: time.Now()},
		arrived: e.Arrived, committed: e.Committed}
}

// Arrive calls the entry's Arrived, when it has one.
func (d *Delivery) Arrive() {
	if d.arrived != nil {
		d.arrived()
	}
}

// Served notes the plugin version and guard that run the delivery.
func (d *Delivery) Served(plugin, version, guardName string) {
	d.Record.Plugin, d.Record.PluginVersion, d.Record.Guard = plugin, version, guardName
}

// Guard is what the guard runner needs to write an applied run's record
// in the job's own transaction.
func (d *Delivery) Guard() guard.Delivery {
	r := d.Record
	return guard.Delivery{OutboxID: r.OutboxID, StreamID: r.StreamID, Deliveries: int64(r.Deliveries),
		Consumer: r.Consumer, Plugin: r.Plugin, Version: r.PluginVersion, Guard: r.Guard, Started: r.StartedAt,
		Arrived: d.arrived, Committed: d.committed}
}

// Verdict sets how the delivery ended, with why (reason) and the error.
func (d *Delivery) Verdict(v outcome.Outcome, reason, err string) {
	d.Record.Verdict, d.Record.Reason, d.Record.Error = v, ShortError(reason), ShortError(err)
}

// Finish settles an applied (its outcome not written in the job's own
// transaction) or absorbed delivery: the outbox row's mark and the record.
func (s *Settler) Finish(ctx context.Context, d *Delivery, o outcome.Outcome) error {
	d.Record.Verdict = o
	return s.tx(ctx, d, true, nil)
}

// Retry commits the delayed run r of d's job with d's record and the
// outbox row's retry_scheduled mark. It reports false when that run was
// scheduled already (a redelivery of an entry whose ack was lost).
func (s *Settler) Retry(ctx context.Context, d *Delivery, r schedule.Run) (added bool, err error) {
	err = s.tx(ctx, d, true, func(ctx context.Context, tx pgx.Tx) (err error) {
		added, err = schedule.Add(ctx, tx, r)
		return err
	})
	return added, err
}

// Cancelled settles a delivery not run because its job was cancelled
// while its entry was on the stream (usher_settle_cancel): its outbox row
// is marked cancelled, and its deduplication key freed, only when it has
// no outcome yet. A row that has one keeps it: the delivery is a
// duplicate of a job that ended before the cancel reached this host, and
// is recorded as absorbed, saying so. d's verdict is set to what was
// recorded; why is the reason of a cancel that won.
func (s *Settler) Cancelled(ctx context.Context, d *Delivery, why string) error {
	return s.tx(ctx, d, false, func(ctx context.Context, tx pgx.Tx) error {
		var was *string
		if err := tx.QueryRow(ctx, `SELECT usher_settle_cancel($1, $2, $3)`, d.Record.OutboxID, d.Record.JobID, d.Record.Kind).Scan(&was); err != nil {
			return fmt.Errorf("settle: cancel outbox row %d: %w", d.Record.OutboxID, err)
		}
		switch {
		case was == nil || *was == "" || *was == string(outcome.Cancelled):
			d.Verdict(outcome.Cancelled, why, "")
		default:
			d.Verdict(outcome.Absorbed, fmt.Sprintf("a duplicate: its outbox row was settled %s before the cancel reached this host; nothing ran", *was), "")
		}
		return nil
	})
}

// WakeClaim makes the retries waiting for the effect claim key due now
// (schedule.WakeClaim) and returns how many.
func (s *Settler) WakeClaim(ctx context.Context, key string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	return schedule.WakeClaim(ctx, s.cfg.Pool, key)
}

// DeadLetter commits the letter l with d's record and the outbox row's
// dead_letter mark. d is nil for an entry that is no job's delivery (a
// forged one): then only the letter is written.
func (s *Settler) DeadLetter(ctx context.Context, d *Delivery, l deadletter.Letter) error {
	return s.tx(ctx, d, d != nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := deadletter.Add(ctx, tx, l)
		return err
	})
}

// Abandoned writes the record of a delivery that did not finish (its
// entry stays pending and runs again): there is no outcome to mark.
func (s *Settler) Abandoned(ctx context.Context, d *Delivery) error {
	return s.tx(ctx, d, false, nil)
}

// tx runs write, the outbox row's mark with d's verdict (when mark and d
// has a row), and d's record, in one transaction.
func (s *Settler) tx(ctx context.Context, d *Delivery, mark bool, write func(context.Context, pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	return pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		if write != nil {
			if err := write(ctx, tx); err != nil {
				return err
			}
		}
		if d == nil {
			return nil
		}
		if mark && d.Record.Verdict != outcome.Abandoned {
			if err := outbox.Finish(ctx, tx, d.Record.OutboxID, d.Record.Verdict); err != nil {
				return err
			}
		}
		if d.Record.JobID == "" || d.Record.Kind == "" || d.Record.Verdict == "" {
			return nil
		}
		return history.Write(ctx, tx, d.Record)
	})
}

// Absorbed counts a duplicate a guard absorbed in Postgres, so `host
// inspect` sees every host's count. A count that cannot be written is
// logged: the duplicate was absorbed all the same.
func (s *Settler) Absorbed(guardName, kind, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.cfg.Pool.Exec(ctx, `
		INSERT INTO absorbed_duplicates (guard, kind, reason, count) VALUES ($1, $2, $3, 1)
		ON CONFLICT (guard, kind, reason) DO UPDATE SET count = absorbed_duplicates.count + 1`,
		guardName, kind, reason); err != nil {
		s.cfg.Logger.Warn("count absorbed duplicate", "err", err)
	}
}

// WaitedForKind records on outbox row id (of kind) that its entry waits
// for a host serving its kind: the reconciler then does not publish the
// row again (its entry is still in the stream), and `host inspect` counts
// it. It reports whether this was the row's first wait.
func (s *Settler) WaitedForKind(ctx context.Context, id int64, kind string) (first bool, err error) {
	if id <= 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	err = s.cfg.Pool.QueryRow(ctx, `
		WITH b AS (SELECT id, kind_waited_at FROM outbox WHERE id = $1 AND kind = $2 AND done_at IS NULL FOR UPDATE)
		UPDATE outbox o SET kind_waited_at = now() FROM b WHERE o.id = b.id
		RETURNING b.kind_waited_at IS NULL`, id, kind).Scan(&first)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("settle: record the wait of outbox row %d for its kind: %w", id, err)
	}
	return first, nil
}

package host

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/stream"
)

// delivery is one delivery's history record while it runs. The verdict
// is filled in where it is decided; written says the record went out with
// the outcome it belongs to (in the job's own transaction for an applied
// job, in the dead letter's or the retry's otherwise).
type delivery struct {
	rec     history.Record
	written bool
	// arrived and committed are the entry's Arrived and Committed
	// (stream.Entry).
	arrived, committed func()
}

func (h *Host) newDelivery(e stream.Entry) *delivery {
	return &delivery{rec: history.Record{JobID: e.JobID, Kind: e.Kind, OutboxID: e.OutboxID, RequestID: e.RequestID,
		Attempt: e.Attempt, Deliveries: int(e.Deliveries), StreamID: e.StreamID, Consumer: h.cfg.Consumer, StartedAt: time.Now()},
		arrived: e.Arrived, committed: e.Committed}
}

// arrive calls the entry's Arrived, when it has one.
func (d *delivery) arrive() {
	if d.arrived != nil {
		d.arrived()
	}
}

// served notes the plugin and guard that run the delivery.
func (d *delivery) served(rt route) {
	if rt.plugin != nil {
		m := rt.plugin.Manifest()
		d.rec.Plugin, d.rec.PluginVersion = m.Name, m.Version
	}
	d.rec.Guard = guardName(rt.guard)
}

// guardDelivery is what the runner needs to write an applied run's record
// in the job's own transaction.
func (d *delivery) guardDelivery() guard.Delivery {
	return guard.Delivery{OutboxID: d.rec.OutboxID, StreamID: d.rec.StreamID, Deliveries: int64(d.rec.Deliveries),
		Consumer: d.rec.Consumer, Plugin: d.rec.Plugin, Version: d.rec.PluginVersion, Guard: d.rec.Guard, Started: d.rec.StartedAt,
		Arrived: d.arrived, Committed: d.committed}
}

func (d *delivery) verdict(v, reason, err string) {
	d.rec.Verdict, d.rec.Reason, d.rec.Error = v, shortError(reason), shortError(err)
}

// write writes the record in tx (the outcome's transaction), unless it
// was written already or has no verdict or no job to belong to.
func (d *delivery) write(ctx context.Context, tx pgx.Tx) error {
	if d == nil || d.written || d.rec.Verdict == "" || d.rec.JobID == "" || d.rec.Kind == "" {
		return nil
	}
	if err := history.Write(ctx, tx, d.rec); err != nil {
		return err
	}
	d.written = true
	return nil
}

// withRecord runs f and writes d's record in one transaction on the
// host's pool: the outcome f writes and the record commit together.
func (h *Host) withRecord(ctx context.Context, d *delivery, f func(pgx.Tx) error) error {
	written := d != nil && d.written
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		if err := f(tx); err != nil {
			return err
		}
		return d.write(ctx, tx)
	})
	if err != nil && d != nil {
		d.written = written // rolled back with it
	}
	return err
}

// recordAbandoned writes the record of a delivery that did not finish (it
// stays pending and runs again): there is no outcome to write it with.
func (h *Host) recordAbandoned(ctx context.Context, d *delivery) {
	if d.rec.Verdict != history.Abandoned {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.withRecord(wctx, d, func(pgx.Tx) error { return nil }); err != nil {
		h.log.Warn("could not record an abandoned delivery in the job's history", "stream_id", d.rec.StreamID, "err", err)
	}
}

// retryReason is a retry's history reason: why, and when it runs again.
func retryReason(out guard.Outcome) string {
	why := out.Reason
	if why == "" {
		why = "the handler asked to run later"
	}
	return fmt.Sprintf("%s; runs again in %s", why, out.RetryAfter.Round(time.Millisecond))
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/wire"
)

// dispatch runs one entry and reports whether it may be acked. It never
// panics the host and never drops an entry silently: a finished job is
// acked, a job to retry is acked after its delayed run is committed, a job
// that can never succeed is acked after its dead letter is committed, and
// anything else stays pending to be reclaimed.
func (h *Host) dispatch(ctx context.Context, e stream.Entry) bool {
	d := h.newDelivery(e)
	outcome, ack := h.run(ctx, e, d)
	if !ack {
		h.recordAbandoned(ctx, d)
		return false
	}
	switch outcome {
	case outcomeForged:
		// The outbox row whose id a forged entry claims belongs to a real
		// job: recording an outcome on it would let that job rest unrun.
		return true
	case outcomeRecorded:
		// Written in the job's own transaction.
		return true
	}
	// Record the outcome before the ack: a row with no outcome is
	// eventually republished, so this write is what lets it rest. The
	// delivery's history record commits with it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := h.withRecord(wctx, d, func(tx pgx.Tx) error { return outbox.Finish(wctx, tx, e.OutboxID, outcome) }); err != nil {
		h.log.Warn("could not record the job's outcome; entry left pending", "stream_id", e.StreamID, "err", err)
		return false
	}
	return true
}

// run runs one entry and returns its outcome and whether it may be acked.
func (h *Host) run(ctx context.Context, e stream.Entry, d *delivery) (outcome string, ack bool) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			h.log.Error("dispatch panicked; entry left pending", "stream_id", e.StreamID, "job_id", e.JobID, "panic", r)
			outcome, ack = "", false
		}
	}()
	// Every way out before the runner arrives the entry first
	// (stream.Entry.Arrived): its job joins no batch, and no batch of
	// another job is to wait for it while it is dead-lettered or parked.
	if cause, reason := h.refuse(e); cause != "" {
		d.arrive()
		switch cause {
		case causeForged:
			return outcomeForged, h.deadLetter(ctx, e, d, cause, reason, "")
		case causeWaitForKind:
			h.waitForKind(ctx, e)
			return "", false
		default:
			return "dead_letter", h.deadLetter(ctx, e, d, cause, reason, "")
		}
	}
	h.mu.RLock()
	rt := h.routes[e.Kind]
	h.mu.RUnlock()
	d.served(rt)
	if !rt.plugin.Ready() {
		d.arrive()
		// Unhealthy (its kinds wait in the stream, not in dead letters,
		// until the plugin is reloaded) or between a crash and its
		// restart: park gives the delivery back so the wait does not
		// count towards MaxDeliveries.
		h.park(ctx, e, rt, "its plugin is not running")
		h.redispatchWhenReady(e, rt)
		return "", false
	}
	if rt.l != nil && rt.l.stalled.Load() >= h.stalledCap() {
		// The plugin's stalled jobs hold half the slots: the others'
		// jobs keep the rest. This one runs when a stalled job ends.
		d.arrive()
		h.park(ctx, e, rt, "its plugin's stalled jobs hold their share of the slots")
		h.redispatchWhenReady(e, rt)
		return "", false
	}
	if e.Deliveries > h.cfg.MaxDeliveries {
		d.arrive()
		return "dead_letter", h.deadLetter(ctx, e, d, "max_deliveries",
			fmt.Sprintf("delivered %d times (max %d) without finishing; the last runs crashed, hung or lost their host", e.Deliveries, h.cfg.MaxDeliveries), "")
	}
	crashes := h.crashes(ctx, e)
	if crashes >= int64(h.cfg.PoisonCrashes) {
		d.arrive()
		return "dead_letter", h.poison(ctx, e, d, crashes, nil)
	}
	defer func() {
		if ack && crashes > 0 {
			h.clearCrashes(ctx, e)
		}
	}()

	ctx, span, traceparent := h.startSpan(ctx, e)
	defer span.End()
	jobCtx, cancel := context.WithTimeout(ctx, h.cfg.JobTimeout)
	defer cancel()
	if crashes > 0 {
		// In flight during a crash before: alone, a crash now is its own.
		jobCtx = pluginhost.Alone(jobCtx)
	}
	job := &usherv1.Job{Id: e.JobID, Kind: e.Kind, Payload: e.Payload, Attempt: int32(e.Attempt),
		RequestId: e.RequestID, Trace: traceparent}
	if rt.l != nil {
		// Counted as stalled while it runs past StalledAfter.
		// state: 0 running, 1 counted as stalled, 2 ended first.
		var state atomic.Int32
		t := time.AfterFunc(h.cfg.StalledAfter, func() {
			if state.CompareAndSwap(0, 1) {
				rt.l.stalled.Add(1)
				// Its slot goes to the next entry: a plugin that
				// hangs does not hold the host's slots.
				if c := h.liveConsumer(); c != nil {
					c.Detach(e.StreamID)
				}
			}
		})
		defer func() {
			t.Stop()
			if !state.CompareAndSwap(0, 2) {
				rt.l.stalled.Add(-1)
			}
		}()
	}
	if rt.l != nil {
		rt.l.inflight.Add(1)
		defer rt.l.inflight.Add(-1) // counted until its outcome is written
	}
	out := h.runner.Run(jobCtx, rt.plugin, rt.db, rt.guard, job, d.guardDelivery())
	// The plugin's side of the call times out on the deadline the call
	// carried, and its answer can arrive before this side's own timer
	// has fired (a loaded machine runs timers late): the clock decides.
	deadline, _ := jobCtx.Deadline()
	overran := errors.Is(jobCtx.Err(), context.DeadlineExceeded) || !time.Now().Before(deadline)
	if out.Verdict != guard.Applied && out.Verdict != guard.Absorbed && overran && ctx.Err() == nil {
		// The handler overran its deadline: its statements were cancelled
		// and its transaction rolled back. Retry it like a transient
		// failure, after its backoff.
		out = guard.Outcome{Verdict: guard.Retry, RetryAfter: h.runner.Backoff(job.GetAttempt()),
			Err: fmt.Errorf("timed out after %s: %w", h.cfg.JobTimeout, out.Err)}
		out.Reason = out.Err.Error()
	}
	h.metrics.duration.WithLabelValues(e.Kind).Observe(time.Since(start).Seconds())
	h.metrics.jobs.WithLabelValues(e.Kind, out.Verdict.String()).Inc()
	h.judge(ctx, rt, start, out) // a version on probation is rolled back if it fails
	// Built only on the paths that log: an applied job, the hot path,
	// logs nothing at info.
	jobLog := func() *slog.Logger {
		return h.log.With("job_id", e.JobID, "kind", e.Kind, "stream_id", e.StreamID, "attempt", e.Attempt,
			"request_id", e.RequestID, "trace", traceparent)
	}

	switch out.Verdict {
	case guard.Applied:
		if h.log.Enabled(ctx, slog.LevelDebug) {
			jobLog().Debug("job applied")
		}
		d.verdict(history.Applied, "", "")
		if out.Recorded {
			d.written = true // in the job's own transaction
			return outcomeRecorded, true
		}
		return "applied", true
	case guard.Absorbed:
		jobLog().Info("duplicate absorbed", "guard", guardName(rt.guard), "reason", out.Reason)
		d.verdict(history.Absorbed, out.Reason, "")
		return "absorbed", true
	case guard.Retry:
		d.verdict(history.Retry, retryReason(out), errText(out.Err))
		if out.Err != nil && e.Attempt+1 >= h.cfg.MaxAttempts {
			return "dead_letter", h.deadLetter(ctx, e, d, "max_attempts",
				fmt.Sprintf("failed %d attempts (max %d)", e.Attempt+1, h.cfg.MaxAttempts), out.Reason)
		}
		return "retry_scheduled", h.retry(ctx, e, d, out, jobLog())
	case guard.Permanent:
		return "dead_letter", h.deadLetter(ctx, e, d, "permanent", out.Reason, out.Reason)
	default: // Abandoned
		d.verdict(history.Abandoned, "", out.Reason)
		var crash *pluginhost.CrashError
		if errors.As(out.Err, &crash) {
			if n := h.chargeCrash(ctx, e); n >= int64(h.cfg.PoisonCrashes) {
				return "dead_letter", h.poison(ctx, e, d, n, crash)
			}
			// Its plugin is restarted: run it again then, here.
			h.redispatchWhenReady(e, rt)
			jobLog().Warn("job interrupted by its plugin's crash; it runs again when the plugin is back", "err", shortError(out.Reason))
			return "", false
		}
		if errors.Is(out.Err, pluginhost.ErrUnavailable) {
			// Started as its plugin died: run it again when it is back.
			h.redispatchWhenReady(e, rt)
			jobLog().Info("job found its plugin not running; it runs again when the plugin is back")
			return "", false
		}
		jobLog().Warn("job did not finish; entry left pending for reclaim", "err", shortError(out.Reason))
		return "", false
	}
}

// stalledCap is how many stalled jobs one plugin may have in flight
// before its further entries are parked: half the slots.
func (h *Host) stalledCap() int64 { return int64(max(1, h.cfg.Concurrency/2)) }

// Dead-letter causes decided before any plugin sees the entry, and the
// outcome of a forged entry, which is recorded on no outbox row.
const (
	causeBadInput = "bad_input"
	causeForged   = "forged"
	outcomeForged = "forged"
	// outcomeRecorded: applied, the outcome already written in the job's
	// own transaction.
	outcomeRecorded = "applied (recorded)"
)

// refuse checks what can be checked before any plugin sees the entry and
// returns the dead letter's cause and reason, causeWaitForKind to leave it
// pending (see unknownKind), or "" to run it. The
// signature comes first: an entry no relay of this cluster signed is
// forged whatever else it holds, and nothing it claims (its job id, its
// outbox id) is trusted.
func (h *Host) refuse(e stream.Entry) (cause, reason string) {
	if e.Cut {
		// Only prefixes were read: nothing can verify it, and no relay
		// of ours publishes an entry this large (outbox.Add refuses the
		// payload), so it is handled as a forgery would be.
		return causeForged, fmt.Sprintf("entry %s of %d bytes is over the %d-byte limit and cannot be verified: no relay of this cluster publishes one (%v)",
			e.StreamID, e.Size, stream.MaxEntryBytes, e.Err)
	}
	if !e.Signed.Verify(h.key, e.Sig) {
		why := "its signature does not match its fields"
		if e.Sig == "" {
			why = "it has no signature"
		}
		return causeForged, fmt.Sprintf("entry %s is not signed by a relay of this cluster: forged or altered (%s; it claims job %.64q, outbox id %.32q, kind %.64q)",
			e.StreamID, why, e.JobID, e.Signed.OutboxID, e.Kind)
	}
	if e.Err != nil {
		return causeBadInput, "malformed entry: " + e.Err.Error()
	}
	if e.Size > wire.MaxPayloadBytes {
		return causeBadInput, fmt.Sprintf("entry of %d bytes exceeds the %d-byte limit", e.Size, wire.MaxPayloadBytes)
	}
	h.mu.RLock()
	_, known := h.routes[e.Kind]
	h.mu.RUnlock()
	if !known {
		return h.unknownKind(e) // waits for a host that serves it, up to UnknownKindWait
	}
	if !json.Valid(e.Payload) {
		return causeBadInput, fmt.Sprintf("payload of %s job %s is not valid JSON", e.Kind, e.JobID)
	}
	return "", ""
}

func (h *Host) retry(ctx context.Context, e stream.Entry, d *delivery, out guard.Outcome, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) bool {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var added bool
	err := h.withRecord(wctx, d, func(tx pgx.Tx) (err error) {
		added, err = schedule.Add(wctx, tx, schedule.Run{
			JobID: e.JobID, Attempt: e.Attempt + 1, Kind: e.Kind, Payload: e.Payload,
			RequestID: e.RequestID, Trace: e.Trace, Reason: storedError(out.Reason), RunAt: time.Now().Add(out.RetryAfter),
		})
		return err
	})
	if err != nil {
		log.Warn("could not schedule retry; entry left pending", "err", err)
		return false
	}
	log.Info("job scheduled to run again", "in", out.RetryAfter, "reason", shortError(out.Reason), "already_scheduled", !added)
	return true
}

// deadLetter records the entry in Postgres; only then may it be acked.
// lastErr (reason when empty) is the full error, stored once in
// last_error; the reason, the history and the log line carry it cut short.
// An entry refused before any plugin saw it (e.Err) keeps its fields'
// bytes as received in raw; its text columns hold them escaped.
func (h *Host) deadLetter(ctx context.Context, e stream.Entry, d *delivery, cause, reason, lastErr string) bool {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if lastErr == "" {
		lastErr = reason
	}
	reason = shortError(reason)
	hist, _ := json.Marshal([]map[string]any{{
		"at": time.Now().UTC(), "consumer": h.cfg.Consumer, "deliveries": e.Deliveries, "attempt": e.Attempt, "error": shortError(lastErr),
	}})
	jobID := deadletter.Text(e.JobID)
	if jobID == "" {
		jobID = "entry:" + e.StreamID
	}
	kind := deadletter.Text(e.Kind)
	if kind == "" {
		kind = "(none)"
	}
	if cause == causeForged {
		// Never under the identity or kind it claims: those belong to a
		// real job, and a requeue by kind must not pick it up.
		jobID, kind = "forged:"+e.StreamID, deadletter.ForgedKind
		d = nil // it is no job's delivery: no history
	}
	if d != nil {
		d.rec.JobID, d.rec.Kind = jobID, kind
		d.verdict(history.DeadLettered, cause+": "+reason, lastErr)
	}
	var raw []deadletter.RawField
	if e.Err != nil {
		raw = make([]deadletter.RawField, 0, len(e.Fields))
		for _, f := range e.Fields {
			raw = append(raw, deadletter.RawField{Name: []byte(f.Name), Value: []byte(f.Value), NameBytes: f.NameLen, ValueBytes: f.ValueLen})
		}
	}
	err := h.withRecord(wctx, d, func(tx pgx.Tx) error {
		_, err := deadletter.Add(wctx, tx, deadletter.Letter{
			JobID: jobID, Kind: kind, Payload: e.Payload, RequestID: e.RequestID, Trace: e.Trace,
			Reason: reason, LastError: storedError(lastErr), Attempts: e.Attempt + 1, StreamID: e.StreamID, History: hist, Raw: raw,
		})
		return err
	})
	if err != nil {
		h.log.Error("could not write dead letter; entry left pending", "stream_id", e.StreamID, "err", err)
		return false
	}
	// A kind no plugin serves is whatever the entry said: one series
	// for all of them, not one per hostile string.
	label := "(unknown)"
	h.mu.RLock()
	if _, known := h.routes[e.Kind]; known {
		label = e.Kind
	}
	h.mu.RUnlock()
	h.metrics.deadLetters.WithLabelValues(label, cause).Inc()
	h.metrics.jobs.WithLabelValues(label, "dead_letter").Inc()
	h.log.Warn("job dead-lettered", "job_id", shortError(jobID), "kind", shortError(kind), "stream_id", e.StreamID,
		"cause", cause, "reason", reason)
	return true
}

// Package pipeline is the path of one stream entry through the host:
// verify it, route it, admit it (park, poison, limits), run its guard,
// decide its verdict and have it settled. It does no SQL and no Redis of
// its own and never changes the set of plugins: it reads the route table,
// and what it asks of the stream, the settlement and the plugin fleet goes
// through the small interfaces below. A run's verdict reaches the fleet as
// an observation the fleet judges on its own goroutine.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/internal/route"
	"github.com/usherhq/usher/host/internal/settle"
	"github.com/usherhq/usher/host/internal/telemetry"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Routes is the route table (route.Table).
type Routes interface {
	Get(kind string) (route.Route, bool)
	Kinds() []string
}

// Observation is what a run tells the plugin fleet about the version that
// served it.
type Observation struct {
	// Plugin is the plugin's name; Kind and JobID the job's.
	Plugin, Kind, JobID string
	// Start is when the job was taken: a job started before a swap says
	// nothing of the version swapped in.
	Start time.Time
	// Failed: the run failed with an error that counts against a version
	// (abandoned, or a transient error), not the job's own permanent
	// failure or a retry its handler asked for.
	Failed bool
	// Crashes, when set, is how often the entry crashed the plugin's
	// process (poison suspected), Last the last crash; Failed is not set.
	Crashes int64
	Last    string
}

// Fleet is what the pipeline asks of the plugin fleet.
type Fleet interface {
	// Observe hands a finished run to the fleet, which judges the
	// versions on probation with it on its own goroutine. It never blocks.
	Observe(Observation)
	// OnProbation reports whether the version serving kind was swapped in
	// recently and is still judged (a rollback may come).
	OnProbation(kind string) bool
}

// Pending is what the pipeline asks of the stream for an entry it does not
// finish (stream.Pending).
type Pending interface {
	GiveBack(ctx context.Context, e stream.Entry) (int64, error)
	Crashes(ctx context.Context, e stream.Entry) (int64, error)
	ChargeCrash(ctx context.Context, e stream.Entry) (int64, error)
	SetCrashes(ctx context.Context, e stream.Entry, n int64) error
	ClearCrashes(ctx context.Context, e stream.Entry) error
}

// Redelivery runs an entry again on this host once its plugin is ready
// (stream.Redispatcher).
type Redelivery interface{ Later(e stream.Entry) }

// Settler writes outcomes (settle.Settler).
type Settler interface {
	Finish(ctx context.Context, d *settle.Delivery, o outcome.Outcome) error
	Retry(ctx context.Context, d *settle.Delivery, r schedule.Run) (bool, error)
	DeadLetter(ctx context.Context, d *settle.Delivery, l deadletter.Letter) error
	Abandoned(ctx context.Context, d *settle.Delivery) error
	Cancelled(ctx context.Context, d *settle.Delivery, why string) error
	WaitedForKind(ctx context.Context, outboxID int64, kind string) (bool, error)
	WakeClaim(ctx context.Context, key string) (int64, error)
}

// Runner runs guards (guard.Runner).
type Runner interface {
	Run(ctx context.Context, inv guard.Invoker, db guard.DB, g usherv1.Guard, job *usherv1.Job, d guard.Delivery) guard.Outcome
	Backoff(attempt int32) time.Duration
}

// Config configures a Pipeline. Every field is required unless it says
// otherwise; the host fills the defaults of the durations and limits.
type Config struct {
	// Consumer is this host's consumer name; Key the stream's signing key.
	Consumer string
	Key      []byte
	// MaxDeliveries, MaxAttempts, PoisonCrashes: see host.Config.
	MaxDeliveries              int64
	MaxAttempts, PoisonCrashes int
	// Concurrency is the consumer's: a plugin's stalled jobs may hold
	// half of it.
	Concurrency int
	// JobTimeout, StalledAfter, UnknownKindWait: see host.Config.
	JobTimeout, StalledAfter, UnknownKindWait time.Duration

	Routes     Routes
	Fleet      Fleet
	Pending    Pending
	Redelivery Redelivery
	Settler    Settler
	Runner     Runner
	// Paused reports whether an operator paused kind (pause.Watcher):
	// its entries are parked until it is resumed. Optional (nil: none).
	Paused func(kind string) bool
	// Limits holds kinds to their concurrency and rate limits across
	// every host (limits.Limiter): an entry held back is parked until a
	// permit or a token is free. Optional (nil: no limits).
	Limits Limits
	// Cancelled reports whether an operator cancelled job id while its
	// entry was on the stream (jobctl.CancelWatcher, from memory): its
	// delivery is settled cancelled and acked, and no handler runs.
	// Optional (nil: none).
	Cancelled func(id string) bool
	// Start is asked before a workflow step's delivery runs
	// (jobctl.Start, the concurrent ones in one round trip): false when
	// its workflow cancelled the step before it started, and then no
	// handler runs; from then on a cancel leaves it to finish. A job that
	// is not a step is never asked (that write would cost every job 20-30
	// % of its throughput): an operator's cancel of it reaches the hosts
	// through Cancelled. Optional (nil: every step runs).
	Start func(ctx context.Context, outboxID int64, jobID string, step bool) (bool, error)
	// Detach gives the slot of the running entry named key (its
	// stream.Entry.Key) back to the consumer (stream.Consumer.Detach).
	// Optional.
	Detach  func(key string) bool
	Metrics *telemetry.Metrics
	Tracer  telemetry.Tracer
	Logger  *slog.Logger
}

// Limits is what the pipeline asks of the kinds' limits (limits.Limiter).
type Limits interface {
	// Acquire asks to start a job of kind, id naming the run; when ok,
	// release is called once the run ends.
	Acquire(ctx context.Context, kind, id string) (release func(), ok bool, err error)
	// Ready reports whether a start of kind may be tried now.
	Ready(kind string) bool
}

// Pipeline dispatches entries.
type Pipeline struct {
	cfg Config
	log *slog.Logger
}

// New validates cfg.
func New(cfg Config) (*Pipeline, error) {
	if cfg.Consumer == "" || cfg.Routes == nil || cfg.Fleet == nil || cfg.Pending == nil || cfg.Redelivery == nil ||
		cfg.Settler == nil || cfg.Runner == nil || cfg.Metrics == nil || cfg.Logger == nil {
		return nil, errors.New("pipeline: needs Consumer, Routes, Fleet, Pending, Redelivery, Settler, Runner, Metrics and Logger")
	}
	return &Pipeline{cfg: cfg, log: cfg.Logger}, nil
}

// StalledCap is how many stalled jobs one plugin may have in flight
// before its further entries are parked: half the slots.
func (p *Pipeline) StalledCap() int64 { return int64(max(1, p.cfg.Concurrency/2)) }

// Ready reports whether an entry of kind may run now: its plugin is
// running and below its share of stalled jobs (the Redispatcher's test).
func (p *Pipeline) Ready(kind string) bool {
	rt, ok := p.cfg.Routes.Get(kind)
	return ok && rt.Plugin.Ready() && rt.Counters.Stalled.Load() < p.StalledCap() && !p.paused(kind) &&
		(p.cfg.Limits == nil || p.cfg.Limits.Ready(kind))
}

func (p *Pipeline) paused(kind string) bool { return p.cfg.Paused != nil && p.cfg.Paused(kind) }

// step is what run decided for an entry: settle it with outcome, or
// leave it pending (ack false).
type step struct {
	outcome outcome.Outcome
	// written: settled already (in the job's own transaction, or a dead
	// letter or retry committed by run); ack: the entry may be acked;
	// parked: left waiting in the stream by park.
	written, ack, parked bool
}

var pending = step{}

func settled(o outcome.Outcome) step { return step{outcome: o, written: true, ack: true} }

// Dispatch runs one entry and reports whether it may be acked. It never
// panics the host and never drops an entry silently: a finished job is
// acked after its outcome is committed, a job to retry after its delayed
// run is, a job that can never succeed after its dead letter is, and
// anything else stays pending to be reclaimed.
func (p *Pipeline) Dispatch(ctx context.Context, e stream.Entry) bool {
	d := settle.NewDelivery(e, p.cfg.Consumer)
	s := p.run(ctx, e, d)
	if !s.ack {
		if d.Record.Verdict == outcome.Abandoned {
			if err := p.cfg.Settler.Abandoned(ctx, d); err != nil {
				p.log.Warn("could not record an abandoned delivery in the job's history", "stream_id", e.StreamID, "err", err)
			}
		}
		return false
	}
	if s.written {
		return true
	}
	// The outcome before the ack: a row with no outcome is eventually
	// republished, so this write is what lets it rest.
	if err := p.cfg.Settler.Finish(ctx, d, s.outcome); err != nil {
		p.log.Warn("could not record the job's outcome; entry left pending", "stream_id", e.StreamID, "err", err)
		return false
	}
	return true
}

// run runs one entry and says how to settle it.
func (p *Pipeline) run(ctx context.Context, e stream.Entry, d *settle.Delivery) (s step) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("dispatch panicked; entry left pending", "stream_id", e.StreamID, "job_id", e.JobID, "panic", r)
			s = pending
		}
	}()
	// Every way out before the runner arrives the entry first
	// (stream.Entry.Arrived): its job joins no batch, and no batch of
	// another job is to wait for it while it is dead-lettered or parked.
	if c, reason := p.refuse(e); c != "" {
		d.Arrive()
		switch c {
		case causeForged:
			return p.deadLetter(ctx, e, nil, c, reason, "")
		case causeWaitForKind:
			p.waitForKind(ctx, e)
			return pending
		default:
			return p.deadLetter(ctx, e, d, c, reason, "")
		}
	}
	rt, _ := p.cfg.Routes.Get(e.Kind)
	defer func() {
		if !s.parked {
			rt.Counters.Unpark(e.Stream, e.StreamID) // it ran or was settled: waiting no more
		}
	}()
	m := rt.Plugin.Manifest()
	d.Served(m.Name, m.Version, telemetry.GuardName(rt.Guard))
	if p.cfg.Cancelled != nil && p.cfg.Cancelled(e.JobID) {
		// Cancelled by an operator while on the stream: settled, and
		// nothing runs. Before the checks that park an entry, as it needs
		// neither its plugin, nor its kind resumed, nor a permit.
		d.Arrive()
		return p.cancel(ctx, e, d)
	}
	if p.paused(e.Kind) {
		// Waits in the stream, its delivery given back, until resumed:
		// then the redispatcher (or the reclaimer) runs it.
		d.Arrive()
		return p.park(ctx, e, rt, "its kind is paused")
	}
	if !rt.Plugin.Ready() {
		d.Arrive()
		// Unhealthy (its kinds wait in the stream, not in dead letters,
		// until the plugin is reloaded) or between a crash and its
		// restart: park gives the delivery back so the wait does not
		// count towards MaxDeliveries.
		return p.park(ctx, e, rt, "its plugin is not running")
	}
	if rt.Counters.Stalled.Load() >= p.StalledCap() {
		// The plugin's stalled jobs hold half the slots: the others'
		// jobs keep the rest. This one runs when a stalled job ends.
		d.Arrive()
		return p.park(ctx, e, rt, "its plugin's stalled jobs hold their share of the slots")
	}
	if e.Deliveries > p.cfg.MaxDeliveries {
		d.Arrive()
		return p.deadLetter(ctx, e, d, "max_deliveries",
			fmt.Sprintf("delivered %d times (max %d) without finishing; the last runs crashed, hung or lost their host", e.Deliveries, p.cfg.MaxDeliveries), "")
	}
	crashes, err := p.cfg.Pending.Crashes(ctx, e)
	if err != nil {
		p.log.Warn("could not read an entry's crash count; running it as if it had none", "stream_id", e.StreamID, "err", err)
	}
	if crashes >= int64(p.cfg.PoisonCrashes) {
		d.Arrive()
		return p.poison(ctx, e, d, rt, crashes, nil)
	}
	if p.cfg.Limits != nil {
		release, ok, err := p.cfg.Limits.Acquire(ctx, e.Kind, e.Key())
		if err != nil || !ok {
			// Held back by its kind's limit (or the limit could not be
			// asked): it waits in the stream, its delivery given back, and
			// runs when a permit or a token is free. Not an attempt.
			if err != nil {
				p.log.Warn("could not ask the kind's limits; the entry waits", "stream_id", e.StreamID, "kind", e.Kind, "err", err)
			}
			d.Arrive()
			return p.park(ctx, e, rt, "its kind is at its limit")
		}
		defer release()
	}
	defer func() {
		if s.ack && crashes > 0 {
			p.clearCrashes(ctx, e)
		}
	}()
	if p.cfg.Start != nil && e.Step {
		run, err := p.cfg.Start(ctx, e.OutboxID, e.JobID, e.Step)
		if err != nil {
			d.Arrive()
			p.log.Warn("could not ask whether the job was cancelled; entry left pending", "stream_id", e.StreamID, "job_id", e.JobID, "err", err)
			return pending
		}
		if !run {
			// Cancelled before it started: settled, and nothing runs.
			d.Arrive()
			d.Verdict(outcome.Cancelled, "its workflow cancelled the step before it started", "")
			return step{outcome: outcome.Cancelled, ack: true}
		}
	}

	ctx, span, traceparent := p.cfg.Tracer.JobSpan(ctx, e.Trace, e.Kind, e.JobID, e.StreamID, e.Attempt)
	defer span.End()
	jobCtx, cancel := context.WithTimeout(ctx, p.cfg.JobTimeout)
	defer cancel()
	if crashes > 0 {
		// In flight during a crash before: alone, a crash now is its own.
		jobCtx = pluginhost.Alone(jobCtx)
	}
	job := &usherv1.Job{Id: e.JobID, Kind: e.Kind, Payload: e.Payload, Attempt: int32(e.Attempt),
		RequestId: e.RequestID, Trace: traceparent}
	defer p.watchStall(e, rt)()
	rt.Counters.InFlight.Add(1)
	defer rt.Counters.InFlight.Add(-1) // counted until its outcome is written
	out := p.cfg.Runner.Run(jobCtx, rt.Plugin, rt.DB, rt.Guard, job, d.Guard())
	if out.Version != "" {
		d.Record.PluginVersion = out.Version // the version that ran it
	}
	// The plugin's side of the call times out on the deadline the call
	// carried, and its answer can arrive before this side's own timer
	// has fired (a loaded machine runs timers late): the clock decides.
	deadline, _ := jobCtx.Deadline()
	overran := errors.Is(jobCtx.Err(), context.DeadlineExceeded) || !time.Now().Before(deadline)
	if out.Verdict != guard.Applied && out.Verdict != guard.Absorbed && overran && ctx.Err() == nil {
		// The handler overran its deadline: its statements were cancelled
		// and its transaction rolled back. Retry it like a transient
		// failure, after its backoff.
		out = guard.Outcome{Verdict: guard.Retry, RetryAfter: p.cfg.Runner.Backoff(job.GetAttempt()),
			Err: fmt.Errorf("timed out after %s: %w", p.cfg.JobTimeout, out.Err)}
		out.Reason = out.Err.Error()
	}
	p.cfg.Metrics.Duration.WithLabelValues(e.Kind).Observe(time.Since(start).Seconds())
	p.cfg.Metrics.Jobs.WithLabelValues(e.Kind, out.Verdict.String()).Inc()
	if ctx.Err() == nil {
		// A version on probation is judged by the fleet (and rolled back if
		// it fails), on the fleet's goroutine.
		p.cfg.Fleet.Observe(Observation{Plugin: rt.Name, Kind: e.Kind, JobID: e.JobID, Start: start,
			Failed: out.Verdict == guard.Abandoned || (out.Verdict == guard.Retry && out.Err != nil)})
	}
	s = p.verdict(ctx, e, d, rt, out, traceparent)
	if out.Frees != "" {
		p.wakeClaim(ctx, e, out.Frees)
	}
	return s
}

// cancel settles a delivery of a job an operator cancelled on the stream
// (Settler.Cancelled: a row that already has an outcome keeps it).
func (p *Pipeline) cancel(ctx context.Context, e stream.Entry, d *settle.Delivery) step {
	if err := p.cfg.Settler.Cancelled(ctx, d, "cancelled by an operator while on the stream; no handler ran"); err != nil {
		p.log.Warn("could not settle a cancelled job; entry left pending", "stream_id", e.StreamID, "job_id", e.JobID, "err", err)
		return pending
	}
	p.log.Info("job cancelled on the stream settled without running", "job_id", e.JobID, "kind", e.Kind,
		"stream_id", e.StreamID, "verdict", d.Record.Verdict)
	return settled(d.Record.Verdict)
}

// wakeClaim has the retries waiting for the effect claim key run now: its
// owner (this run) marked it done or gave it back. Best effort: a retry
// not woken runs after the claim's lease, as before.
func (p *Pipeline) wakeClaim(ctx context.Context, e stream.Entry, key string) {
	n, err := p.cfg.Settler.WakeClaim(ctx, key)
	if err != nil {
		p.log.Warn("could not wake the retries waiting for a claim; they run after its lease", "job_id", e.JobID, "kind", e.Kind, "err", err)
		return
	}
	if n > 0 {
		p.log.Info("woke the retries waiting for a claim this run freed", "job_id", e.JobID, "kind", e.Kind, "woken", n)
	}
}

// watchStall counts the job as stalled while it runs past StalledAfter,
// and gives its slot to the next entry then: a plugin that hangs does not
// hold the host's slots. It returns the function that ends the watch.
func (p *Pipeline) watchStall(e stream.Entry, rt route.Route) func() {
	// state: 0 running, 1 counted as stalled, 2 ended first.
	var state atomic.Int32
	t := time.AfterFunc(p.cfg.StalledAfter, func() {
		if state.CompareAndSwap(0, 1) {
			rt.Counters.Stalled.Add(1)
			if p.cfg.Detach != nil {
				p.cfg.Detach(e.Key())
			}
		}
	})
	return func() {
		t.Stop()
		if !state.CompareAndSwap(0, 2) {
			rt.Counters.Stalled.Add(-1)
		}
	}
}

// verdict turns the guard's outcome into the entry's settlement.
func (p *Pipeline) verdict(ctx context.Context, e stream.Entry, d *settle.Delivery, rt route.Route, out guard.Outcome, traceparent string) step {
	// Built only on the paths that log: an applied job, the hot path,
	// logs nothing at info.
	jobLog := func() *slog.Logger {
		return p.log.With("job_id", e.JobID, "kind", e.Kind, "stream_id", e.StreamID, "attempt", e.Attempt,
			"request_id", e.RequestID, "trace", traceparent)
	}
	switch out.Verdict {
	case guard.Applied:
		if p.log.Enabled(ctx, slog.LevelDebug) {
			jobLog().Debug("job applied")
		}
		d.Verdict(outcome.Applied, "", "")
		if out.Recorded {
			return settled(outcome.Applied) // in the job's own transaction
		}
		return step{outcome: outcome.Applied, ack: true}
	case guard.Absorbed:
		jobLog().Info("duplicate absorbed", "guard", telemetry.GuardName(rt.Guard), "reason", out.Reason)
		d.Verdict(outcome.Absorbed, out.Reason, "")
		return step{outcome: outcome.Absorbed, ack: true}
	case guard.Retry:
		d.Verdict(outcome.RetryScheduled, retryReason(out), errText(out.Err))
		if e.Attempt+1 >= p.cfg.MaxAttempts {
			// Every retry counts, those the handler asked for too: a
			// job that asks to run later for ever ends here.
			why := "failed"
			if out.Err == nil {
				why = "ran without finishing (the last asked to run later)"
			}
			return p.deadLetter(ctx, e, d, "max_attempts",
				fmt.Sprintf("%s %d attempts (max %d)", why, e.Attempt+1, p.cfg.MaxAttempts), out.Reason)
		}
		return p.retry(ctx, e, d, out, jobLog())
	case guard.Permanent:
		return p.deadLetter(ctx, e, d, "permanent", out.Reason, out.Reason)
	default: // Abandoned
		d.Verdict(outcome.Abandoned, "", out.Reason)
		var crash *pluginhost.CrashError
		if errors.As(out.Err, &crash) {
			n, err := p.cfg.Pending.ChargeCrash(ctx, e)
			if err != nil {
				// Not counted: MaxDeliveries still bounds the entry.
				p.log.Warn("could not count an entry's crash", "stream_id", e.StreamID, "err", err)
			}
			if n >= int64(p.cfg.PoisonCrashes) {
				return p.poison(ctx, e, d, rt, n, crash)
			}
			// Its plugin is restarted: run it again then, here.
			p.redispatch(e, rt)
			jobLog().Warn("job interrupted by its plugin's crash; it runs again when the plugin is back", "err", settle.ShortError(out.Reason))
			return pending
		}
		if errors.Is(out.Err, pluginhost.ErrUnavailable) {
			// Started as its plugin died: run it again when it is back.
			p.redispatch(e, rt)
			jobLog().Info("job found its plugin not running; it runs again when the plugin is back")
			return pending
		}
		jobLog().Warn("job did not finish; entry left pending for reclaim", "err", settle.ShortError(out.Reason))
		return pending
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

func (p *Pipeline) retry(ctx context.Context, e stream.Entry, d *settle.Delivery, out guard.Outcome, log *slog.Logger) step {
	added, err := p.cfg.Settler.Retry(ctx, d, schedule.Run{
		JobID: e.JobID, Attempt: e.Attempt + 1, Kind: e.Kind, Payload: e.Payload,
		RequestID: e.RequestID, Trace: e.Trace, Reason: settle.StoredError(out.Reason), RunAt: time.Now().Add(out.RetryAfter),
		Priority: e.Priority,
		// A second of slack for the clocks of this host and Postgres.
		WaitsFor: out.WaitsFor, WaitsSince: d.Record.StartedAt.Add(-time.Second),
	})
	if err != nil {
		log.Warn("could not schedule retry; entry left pending", "err", err)
		return pending
	}
	log.Info("job scheduled to run again", "in", out.RetryAfter, "reason", settle.ShortError(out.Reason), "already_scheduled", !added)
	return settled(outcome.RetryScheduled)
}

// redispatch has the entry run again here once its plugin is ready: for
// a restart or a swap, not a plugin marked unhealthy (its entries wait in
// the stream for the reclaimer) unless its version is on probation (a
// rollback may come). The route is read again: the version that left the
// entry may have been swapped (rolled back) since.
func (p *Pipeline) redispatch(e stream.Entry, rt route.Route) {
	cur, ok := p.cfg.Routes.Get(e.Kind)
	if !ok || cur.Plugin == nil {
		return
	}
	if cur.Plugin == rt.Plugin && !cur.Plugin.Healthy() && !p.cfg.Fleet.OnProbation(e.Kind) {
		return
	}
	p.cfg.Redelivery.Later(e)
}

func (p *Pipeline) clearCrashes(ctx context.Context, e stream.Entry) {
	if err := p.cfg.Pending.ClearCrashes(ctx, e); err != nil {
		p.log.Debug("could not clear an entry's crash count; it expires", "stream_id", e.StreamID, "err", err)
	}
}

// park leaves an entry pending without holding the delivery against it,
// when its plugin cannot take it: marked unhealthy (crash-looping),
// crashed and not restarted yet, or at its share of stalled jobs (or its
// kind is paused or at its limit). The entry counts as parked now
// (route.Counters.ParkedNow) until it runs or is settled here.
//
// The host reads one stream for every kind, so an unhealthy plugin's
// entries are still read (and reclaimed every ReclaimIdle); what stops is
// running them. Each such delivery is given back in Redis (the entry's
// delivery count goes back to what it was before it), so MaxDeliveries
// counts only the deliveries that found a running plugin: an entry parked
// for an hour is not dead-lettered for it when a reload makes the plugin
// healthy again, and a poison entry that crashes the plugin at every run
// still reaches MaxDeliveries, one crash per count. After a reload the
// parked entries run when next reclaimed, within ReclaimIdle. If the give-back fails (Redis
// unreachable) the delivery counts, as it did before: the entry may reach
// MaxDeliveries early and be dead-lettered, never lost. A reclaimed entry
// whose count could not be read (e.Deliveries left at 1) is given back to
// 0: it loses its earlier count, the one way this errs towards running an
// entry more often.
func (p *Pipeline) park(ctx context.Context, e stream.Entry, rt route.Route, why string) step {
	rt.Counters.Park(e.Stream, e.StreamID, time.Now())
	if n, ok := p.giveBack(ctx, e); ok {
		p.log.Debug("entry parked: "+why, "stream_id", e.StreamID, "job_id", e.JobID, "kind", e.Kind,
			"plugin", rt.Name, "deliveries", n)
	}
	p.redispatch(e, rt)
	return step{parked: true}
}

// giveBack gives e's delivery back (stream.Pending.GiveBack); false
// (logged) when Redis could not be asked.
func (p *Pipeline) giveBack(ctx context.Context, e stream.Entry) (int64, bool) {
	n, err := p.cfg.Pending.GiveBack(ctx, e)
	if err != nil {
		p.log.Warn("could not give back the delivery of a parked entry", "stream_id", e.StreamID, "job_id", e.JobID, "err", err)
		return 0, false
	}
	return n, true
}

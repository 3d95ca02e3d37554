package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Invoker calls a plugin. An error means the call did not complete (the
// plugin crashed, hung, or the connection broke), not that the handler
// failed: handler failures come back as results.
type Invoker interface {
	Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error)
}

// A Holder is an Invoker whose calls a job holds for its whole run
// (pluginhost.Gate): Run holds it before the job takes a connection of
// the plugin's pool, so no job holding one waits at the gate.
type Holder interface {
	Hold(ctx context.Context) (context.Context, func(), error)
}

// DB is where a plugin's jobs run: the plugin's own pool, whose
// connections log in as its role (sandbox.OpenPluginPool), and the role's
// name for messages. Every statement of the job, the plugin's and the
// host's (the claim, the mark, usher_record_job, usher_enqueue), runs on it.
type DB struct {
	Pool *pgxpool.Pool
	Role string
}

// Verdict is how a run ended.
type Verdict int

const (
	// Applied: this run applied the effect.
	Applied Verdict = iota + 1
	// Absorbed: a duplicate; the guard found the effect already applied
	// (or being applied) and did nothing.
	Absorbed
	// Retry: run again after RetryAfter (RetryLater, or a transient
	// handler error), keeping the job's identity.
	Retry
	// Permanent: the job can never succeed; dead-letter it.
	Permanent
	// Abandoned: the run could not finish (plugin crashed, database
	// unreachable); leave the entry pending so it is reclaimed.
	Abandoned
)

func (v Verdict) String() string {
	return [...]string{"unknown", "applied", "absorbed", "retry", "permanent", "abandoned"}[v]
}

// Outcome is the result of one run.
type Outcome struct {
	Verdict    Verdict
	Reason     string
	RetryAfter time.Duration
	Err        error
	// Recorded: the outbox row's outcome ('applied') was written in the
	// job's own transaction, so the caller need not write it again.
	Recorded bool
	// Version is the plugin version that answered the job's last call;
	// "" when no call completed. A swap between the job's routing and its
	// call (a job run again alone after its batch was called off) makes it
	// differ from the version the job was routed to: the history names
	// this one.
	Version string
	// WaitsFor names the effect claim a Retry waits for (its claim was
	// held by another run); Frees the claim this run marked done or gave
	// back, whose waiting retries may run now. "" when none.
	WaitsFor, Frees string
}

// applied is the outcome of a run that committed its effect, and with it
// the outbox row's outcome when the job has one; that delivery is settled
// now (Delivery.Committed).
func applied(d Delivery) Outcome {
	if d.OutboxID != 0 && d.Committed != nil {
		d.Committed()
	}
	return Outcome{Verdict: Applied, Recorded: d.OutboxID != 0}
}

func absorbed(reason string) Outcome {
	return Outcome{Verdict: Absorbed, Reason: reason}
}
func abandoned(err error) Outcome { return Outcome{Verdict: Abandoned, Err: err, Reason: err.Error()} }
func permanent(err error) Outcome { return Outcome{Verdict: Permanent, Err: err, Reason: err.Error()} }

// Config configures a Runner.
type Config struct {
	// Handles serves the plugins' callbacks. Required.
	Handles *Handles
	// StatementTimeout bounds each statement of a job, within its
	// deadline; the host cancels it, whatever the plugin set. Default 10s.
	StatementTimeout time.Duration
	// TransientBackoff is the delay before retrying a transient handler
	// error, doubled per attempt up to 5 minutes. Default 1s.
	TransientBackoff time.Duration
	// OnAbsorbed, when set, is told of every duplicate a guard absorbed.
	OnAbsorbed func(guard usherv1.Guard, kind, reason string)
	// BatchMax is the most record-the-job-id jobs of one plugin run in one
	// transaction (see batch.go); 0 or 1 runs each in its own.
	BatchMax int
	// Solo, when set, reports a job that must run by itself, never in a
	// batch: one that was in flight during a crash of its plugin.
	Solo func(ctx context.Context) bool
	// OnBatch, when set, is told of every batch of two jobs or more that
	// reached the plugin (BatchReport).
	OnBatch func(BatchReport)
	// StalledAfter is the longest a batch may run before it is called off
	// (its jobs run again alone) and the next one of its plugin starts
	// without waiting for it; a pool whose recent batches answered fast
	// calls a batch off much sooner (callOffAfter). Default 2s.
	StalledAfter time.Duration
	// Arriving, when set, reports how many jobs are on their way to the
	// runner, of any kind (stream.Consumer.Arriving: read from the
	// stream, or being read, and not yet arrived, see Delivery.Arrived),
	// and a channel closed when that count next falls to 0. When it is
	// set, a batch about to start waits for them, and after a batch is
	// over for as many jobs as it had, for at most GatherWait (see
	// gather).
	Arriving func() (int, <-chan struct{})
	// GatherWait bounds that wait. Default 2ms; negative: no wait.
	GatherWait time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Delivery is the stream delivery a run belongs to. An applied run of a
// job with an outbox row writes its history record (host/history) from
// it, in the job's own transaction.
type Delivery struct {
	// OutboxID is the outbox row the job came from; 0 for none (then
	// nothing is recorded in the job's transaction).
	OutboxID   int64
	StreamID   string
	Deliveries int64
	Consumer   string
	Plugin     string
	Version    string
	Guard      string
	Started    time.Time
	// Arrived, when set, is called once the job is in its batch's queue,
	// or as it starts when it joins no batch (Config.Arriving).
	Arrived func()
	// Committed, when set, is called once an applied run of a job with an
	// outbox row has committed (its outcome with it), before Run returns:
	// its entry may be acked and its slot read into at once.
	Committed func()
}

func (d Delivery) arrive() {
	if d.Arrived != nil {
		d.Arrived()
	}
}

// Runner executes guards.
type Runner struct {
	cfg Config
	// batchers holds a *batcher per plugin pool.
	batchers sync.Map
}

// NewRunner validates cfg and fills its defaults.
func NewRunner(cfg Config) (*Runner, error) {
	if cfg.Handles == nil {
		return nil, errors.New("guard: runner needs Handles")
	}
	if cfg.StatementTimeout <= 0 {
		cfg.StatementTimeout = 10 * time.Second
	}
	if cfg.TransientBackoff <= 0 {
		cfg.TransientBackoff = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StalledAfter <= 0 {
		cfg.StalledAfter = 2 * time.Second
	}
	if cfg.GatherWait == 0 {
		cfg.GatherWait = 2 * time.Millisecond
	}
	cfg.Handles.statementTimeout = cfg.StatementTimeout
	return &Runner{cfg: cfg}, nil
}

// Run executes job's guard against the plugin behind inv, on the plugin's
// database db. ctx's deadline is the job's: every statement, the plugin's
// and the host's, is cancelled when it passes. d.OutboxID, when not 0, is
// the outbox row the job came from: an applied run records its outcome and
// its history record in the job's own transaction (Outcome.Recorded).
func (r *Runner) Run(ctx context.Context, inv Invoker, db DB, g usherv1.Guard, job *usherv1.Job, d Delivery) Outcome {
	ctx = pluginhost.WithAnswered(ctx)
	batched := g == usherv1.Guard_GUARD_JOB_ID && db.Pool != nil && r.batches(ctx)
	if !batched {
		d.arrive() // joins no batch; a batched job arrives once queued
	}
	if h, ok := inv.(Holder); ok {
		held, release, err := h.Hold(ctx)
		if err != nil {
			if batched {
				d.arrive() // it never joins one
			}
			return abandoned(fmt.Errorf("%s job %s did not start: %w", job.GetKind(), job.GetId(), err))
		}
		defer release()
		ctx = held
	}
	var out Outcome
	switch {
	case db.Pool == nil:
		out = permanent(fmt.Errorf("kind %s: its plugin has no database pool of its own", job.GetKind()))
	case g == usherv1.Guard_GUARD_STATE_FIRST:
		out = r.stateFirst(ctx, inv, db, job, d)
	case g == usherv1.Guard_GUARD_CLAIM:
		out = r.claim(ctx, inv, db, job, d)
	case g == usherv1.Guard_GUARD_JOB_ID:
		if batched {
			out = r.jobIDBatched(ctx, inv, db, job, d)
		} else {
			out = r.jobIDOne(ctx, inv, db, job, d)
		}
	default:
		out = permanent(fmt.Errorf("kind %s has no guard", job.GetKind()))
	}
	if out.Verdict == Absorbed && r.cfg.OnAbsorbed != nil {
		r.cfg.OnAbsorbed(g, job.GetKind(), out.Reason)
	}
	if out.Version == "" {
		out.Version = pluginhost.AnsweredVersion(ctx)
	}
	return out
}

// call invokes one phase and maps a failed call or a non-OK result onto an
// Outcome; ok is true when the phase returned OK or DONE.
func (r *Runner) call(ctx context.Context, inv Invoker, c *usherv1.Call) (*usherv1.Result, Outcome, bool) {
	res, err := inv.Invoke(ctx, []*usherv1.Call{c})
	if err != nil && pluginhost.TooLarge(err) {
		// Alone, the job itself is over the cap: its next run would be
		// too, so it is dead-lettered now, not after its deliveries.
		return nil, permanent(fmt.Errorf("%s of %s job %s: its call or the plugin's answer is over the %d-byte message cap: %w",
			phaseName(c.GetPhase()), c.GetJob().GetKind(), c.GetJob().GetId(), contract.MaxMessageBytes, err)), false
	}
	if err != nil {
		return nil, abandoned(fmt.Errorf("%s of %s job %s did not complete: %w", phaseName(c.GetPhase()), c.GetJob().GetKind(), c.GetJob().GetId(), err)), false
	}
	if len(res) != 1 || res[0] == nil {
		return nil, permanent(fmt.Errorf("plugin answered garbage: %d results for 1 calls", len(res))), false
	}
	out, ok := r.result(c, res[0])
	return res[0], out, ok
}

// result maps a phase's result onto an Outcome; ok is true when the phase
// returned OK or DONE.
func (r *Runner) result(c *usherv1.Call, rs *usherv1.Result) (Outcome, bool) {
	if len(rs.GetWrites()) > 0 && (c.GetPhase() != usherv1.Phase_PHASE_APPLY || rs.GetOutcome() != usherv1.Outcome_OUTCOME_OK) {
		return permanent(fmt.Errorf("refused: %s job %s: the plugin returned writes with a %s answer in %s; only an apply phase that succeeded may",
			c.GetJob().GetKind(), c.GetJob().GetId(), rs.GetOutcome(), phaseName(c.GetPhase()))), false
	}
	switch rs.GetOutcome() {
	case usherv1.Outcome_OUTCOME_OK, usherv1.Outcome_OUTCOME_DONE:
		return Outcome{}, true
	case usherv1.Outcome_OUTCOME_RETRY_LATER:
		return Outcome{Verdict: Retry, RetryAfter: RetryLaterDelay(rs.GetRetryAfterMs()), Reason: rs.GetError()}, false
	case usherv1.Outcome_OUTCOME_PERMANENT:
		return permanent(fmt.Errorf("%s: %s", phaseName(c.GetPhase()), rs.GetError())), false
	case usherv1.Outcome_OUTCOME_ERROR:
		err := fmt.Errorf("%s: %s", phaseName(c.GetPhase()), rs.GetError())
		return Outcome{Verdict: Retry, RetryAfter: r.backoff(c.GetJob().GetAttempt()), Err: err, Reason: err.Error()}, false
	default:
		return permanent(fmt.Errorf("plugin answered garbage: outcome %v in %s", rs.GetOutcome(), phaseName(c.GetPhase()))), false
	}
}

// MaxBackoff caps the delay before a transient failure's retry.
const MaxBackoff = 5 * time.Minute

// The bounds of a delay a plugin asks for with RetryLater: a shorter one
// (0, negative) runs after MinRetryLater, a longer one (up to MaxInt64
// milliseconds, which would overflow) after MaxRetryLater. Every retry,
// asked for or not, counts towards the host's MaxAttempts.
const (
	MinRetryLater = 100 * time.Millisecond
	MaxRetryLater = 24 * time.Hour
)

// RetryLaterDelay is the delay of a RetryLater of ms milliseconds, within
// [MinRetryLater, MaxRetryLater].
func RetryLaterDelay(ms int64) time.Duration {
	return time.Duration(min(max(ms, MinRetryLater.Milliseconds()), MaxRetryLater.Milliseconds())) * time.Millisecond
}

// Backoff is the delay before retrying a job's attempt after a transient
// failure: TransientBackoff doubled per attempt, at most MaxBackoff.
func (r *Runner) Backoff(attempt int32) time.Duration { return r.backoff(attempt) }

func (r *Runner) backoff(attempt int32) time.Duration {
	d := r.cfg.TransientBackoff << min(attempt, 16)
	return min(d, MaxBackoff)
}

func phaseName(p usherv1.Phase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PHASE_"))
}

// refused turns a statement the plugin's role was refused during a phase
// into a permanent failure, whatever the plugin answered: a plugin that
// swallows the error must not commit a transaction the database has
// already aborted, or retry what no retry can fix.
func refused(job *usherv1.Job, h *handle) (Outcome, bool) {
	switch {
	case h.broken != nil:
		return permanent(fmt.Errorf("refused: %w", h.broken)), true
	case h.denied != nil:
		return permanent(fmt.Errorf("%s job %s: %w", job.GetKind(), job.GetId(), h.denied)), true
	}
	return Outcome{}, false
}

// stateFirst: check → prepare → commit with a conditional write.
func (r *Runner) stateFirst(ctx context.Context, inv Invoker, db DB, job *usherv1.Job, d Delivery) Outcome {
	ro := r.cfg.Handles.issue(ctx, capReadOnly, job, db.Pool, nil, db.Role)
	res, out, ok := r.call(ctx, inv, &usherv1.Call{Phase: usherv1.Phase_PHASE_CHECK, Job: job, Handle: ro.id})
	r.cfg.Handles.release(ro)
	if out, bad := refused(job, ro); bad {
		return out
	}
	if !ok {
		return out
	}
	if res.GetOutcome() == usherv1.Outcome_OUTCOME_DONE {
		return absorbed("state already reached at check")
	}
	res, out, ok = r.call(ctx, inv, &usherv1.Call{Phase: usherv1.Phase_PHASE_PREPARE, Job: job, State: res.GetState()})
	if !ok {
		return out
	}
	// The transaction's row count so far, in the round trip of its BEGIN.
	var baseline int64
	tx, err := beginWith(ctx, db.Pool, r.cfg.Handles.schema, opening{sql: rowWritesSQL, scan: func(row pgx.Row) error { return row.Scan(&baseline) }})
	if err != nil {
		return abandoned(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	h := r.cfg.Handles.issue(ctx, capCommit, job, db.Pool, tx, db.Role)
	h.baseline = baseline
	_, out, ok = r.call(ctx, inv, &usherv1.Call{Phase: usherv1.Phase_PHASE_COMMIT, Job: job, Handle: h.id, State: res.GetState()})
	r.cfg.Handles.release(h)
	if out, bad := refused(job, h); bad {
		return out
	}
	if !ok {
		return out
	}
	if !h.wroteIf {
		return permanent(fmt.Errorf("commit of %s job %s made no conditional write: state first must end with WriteIf", job.GetKind(), job.GetId()))
	}
	if !h.won {
		// A lost conditional write leaves nothing to commit: the
		// transaction is rolled back (whatever it held, a holdable
		// cursor's query included, never runs). The database says
		// whether the plugin wrote anyway.
		if n, err := rowWrites(ctx, tx); err != nil {
			return abandoned(fmt.Errorf("commit: %w", err))
		} else if n > h.baseline {
			return permanent(fmt.Errorf("refused: %s job %s: the commit phase wrote although its conditional write lost; rolled back", job.GetKind(), job.GetId()))
		}
		return absorbed("conditional write lost to another run")
	}
	if err := tx.Commit(ctx, r.outcome(ctx, job, d)...); err != nil {
		return commitFailed(job, err)
	}
	return applied(d)
}

// commitFailed is the outcome of a job whose commit failed: a refusal of
// the commit gate (SQLSTATE UG001: the plugin's statements changed a role,
// its settings or a large object, see usher_gate_close) fails it for
// good; anything else abandons the run, to be tried again.
func commitFailed(job *usherv1.Job, err error) Outcome {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == gateRefused {
		return permanent(fmt.Errorf("refused: %s job %s: %s", job.GetKind(), job.GetId(), pg.Message))
	}
	return abandoned(fmt.Errorf("commit: %w", err))
}

// gateRefused is the SQLSTATE of usher_gate_close's refusal of what the
// transaction wrote to the catalogs.
const gateRefused = "UG001"

// batches reports whether a job that records its id runs in a batch: when
// batching is on and the job is not to run alone (Config.Solo).
func (r *Runner) batches(ctx context.Context) bool {
	return r.cfg.BatchMax > 1 && (r.cfg.Solo == nil || !r.cfg.Solo(ctx))
}

// jobIDOne records the identity and applies in one transaction of the
// job's own. The identity is recorded by usher_record_job, which runs as
// the runtime's owner and checks that the plugin's role serves the kind.
func (r *Runner) jobIDOne(ctx context.Context, inv Invoker, db DB, job *usherv1.Job, d Delivery) Outcome {
	// BEGIN and the identity's record in one round trip.
	var recorded bool
	tx, err := beginWith(ctx, db.Pool, r.cfg.Handles.schema, r.recordJob(job, &recorded))
	if err != nil {
		if out := claimError(err); out != nil {
			return *out
		}
		return abandoned(fmt.Errorf("record job id: %w", err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if !recorded {
		return absorbed("job id already recorded")
	}
	h := r.cfg.Handles.issue(ctx, capApply, job, db.Pool, tx, db.Role)
	res, out, ok := r.call(ctx, inv, &usherv1.Call{Phase: usherv1.Phase_PHASE_APPLY, Job: job, Handle: h.id})
	if ok {
		out, ok = r.writes(job, h, res.GetWrites())
	}
	r.cfg.Handles.release(h)
	if out, bad := refused(job, h); bad {
		return out
	}
	if !ok {
		return out
	}
	if err := tx.Commit(ctx, r.outcome(ctx, job, d)...); err != nil {
		return commitFailed(job, err)
	}
	return applied(d)
}

// recordJob records job's id in its transaction; recorded is false when
// it was recorded before.
func (r *Runner) recordJob(job *usherv1.Job, recorded *bool) opening {
	return opening{sql: "SELECT " + r.cfg.Handles.fn("usher_record_job") + "($1, $2)", args: []any{job.GetId(), job.GetKind()},
		scan: func(row pgx.Row) error { return row.Scan(recorded) }}
}

// writes runs the writes an apply phase returned with its answer, in
// order, under its handle, in one round trip; ok is false, with the job's outcome, when one
// failed or affected fewer rows than it needs.
func (r *Runner) writes(job *usherv1.Job, h *handle, ws []*usherv1.Statement) (Outcome, bool) {
	p := &writePart{h: h, ws: ws}
	r.cfg.Handles.writeAll([]*writePart{p})
	return r.written(job, p)
}

// written is the outcome of a job's part of writeAll: ok when every write
// ran and affected the rows it needs.
func (r *Runner) written(job *usherv1.Job, p *writePart) (Outcome, bool) {
	if out, bad := refused(job, p.h); bad {
		return out, false
	}
	if failed := p.h.failed; failed != nil {
		// The plugin answered OK after one of its statements failed
		// (a plugin that ignores errors): its transaction is lost. It
		// fails with that statement's error, for good when the
		// statement was wrong, for a retry otherwise.
		err := fmt.Errorf("%s job %s: a statement failed and the plugin answered OK: %s", job.GetKind(), job.GetId(), status.Convert(failed).Message())
		switch status.Code(failed) {
		case codes.InvalidArgument, codes.PermissionDenied:
			return permanent(err), false
		}
		return Outcome{Verdict: Retry, RetryAfter: r.backoff(job.GetAttempt()), Err: err, Reason: err.Error()}, false
	}
	// Each write's rows in order, up to the one that failed.
	for i, n := range p.rows {
		if st := p.ws[i]; n < st.GetMinRows() {
			msg := st.GetMissing()
			if msg == "" {
				msg = fmt.Sprintf("returned write %d affected %d rows, fewer than the %d it needs", i+1, n, st.GetMinRows())
			}
			return permanent(fmt.Errorf("apply: %s", msg)), false
		}
	}
	if p.err != nil {
		code := status.Code(p.err)
		err := fmt.Errorf("%s job %s: returned write %d: %w", job.GetKind(), job.GetId(), len(p.rows)+1, p.err)
		switch code {
		case codes.PermissionDenied, codes.InvalidArgument:
			return permanent(err), false
		}
		return Outcome{Verdict: Retry, RetryAfter: r.backoff(job.GetAttempt()), Err: err, Reason: err.Error()}, false
	}
	if len(p.rows) < len(p.ws) {
		// Another job's write stopped the batch before this one's ran.
		return abandoned(fmt.Errorf("%s job %s: its writes did not run", job.GetKind(), job.GetId())), false
	}
	return Outcome{}, true
}

// outcome is the statement that records an applied job's outbox outcome
// and its history record in its own transaction, sent with the COMMIT;
// none for a job with no outbox row (d.OutboxID 0).
func (r *Runner) outcome(ctx context.Context, job *usherv1.Job, d Delivery) []lastStatement {
	if v := pluginhost.AnsweredVersion(ctx); v != "" {
		d.Version = v // the version that ran it, swapped in or not
	}
	return r.appliedStatement(job, d)
}

// appliedStatement is usher_applied_logged for d's job; none without an
// outbox row.
func (r *Runner) appliedStatement(job *usherv1.Job, d Delivery) []lastStatement {
	if d.OutboxID == 0 {
		return nil
	}
	args := appliedArgs(job, d)
	text := make([][]byte, len(args))
	for i, a := range args {
		text[i] = []byte(fmt.Sprint(a))
	}
	text[len(text)-1] = []byte(d.Started.UTC().Format("2006-01-02T15:04:05.999999Z07:00"))
	return []lastStatement{{sql: r.appliedSQL(), args: text}}
}

// outcomes are the statements that record the applied outcomes of a
// batch's jobs: one usher_applied_batch for all of them when they share
// their consumer, plugin, version and guard (a batch's jobs are one plugin
// process's, so they do), else each job's own.
func (r *Runner) outcomes(jobs []*usherv1.Job, ds []Delivery) []lastStatement {
	var (
		outboxIDs            []int64
		kinds, ids, req, sid []string
		attempts, deliveries []int32
		started              []time.Time
		first                *Delivery
	)
	for i, d := range ds {
		if d.OutboxID == 0 {
			continue
		}
		if first == nil {
			first = &ds[i]
		} else if d.Consumer != first.Consumer || d.Plugin != first.Plugin || d.Version != first.Version || d.Guard != first.Guard {
			var last []lastStatement
			for i, j := range jobs {
				last = append(last, r.appliedStatement(j, ds[i])...)
			}
			return last
		}
		j := jobs[i]
		outboxIDs, kinds, ids = append(outboxIDs, d.OutboxID), append(kinds, j.GetKind()), append(ids, j.GetId())
		attempts, deliveries = append(attempts, j.GetAttempt()), append(deliveries, int32(min(d.Deliveries, math.MaxInt32)))
		req, sid, started = append(req, j.GetRequestId()), append(sid, d.StreamID), append(started, d.Started.UTC())
	}
	if first == nil {
		return nil
	}
	args := [][]byte{textArg(pgtype.Int8ArrayOID, outboxIDs), textArg(pgtype.TextArrayOID, kinds), textArg(pgtype.TextArrayOID, ids),
		textArg(pgtype.Int4ArrayOID, attempts), textArg(pgtype.Int4ArrayOID, deliveries), textArg(pgtype.TextArrayOID, req),
		textArg(pgtype.TextArrayOID, sid), []byte(first.Consumer), []byte(first.Plugin), []byte(first.Version), []byte(first.Guard),
		textArg(pgtype.TimestamptzArrayOID, started)}
	return []lastStatement{{sql: "SELECT " + r.cfg.Handles.fn("usher_applied_batch") + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)", args: args}}
}

// textTypes encodes the arguments of the statements sent with a COMMIT,
// which go in text form. A pgtype.Map caches its plans and is not safe for
// concurrent use: the pools' batches share it under textMu.
var (
	textMu    sync.Mutex
	textTypes = pgtype.NewMap()
)

// textArg is v in Postgres's text form for type oid. The values are the
// runner's own slices of strings, integers and times, which always encode.
func textArg(oid uint32, v any) []byte {
	textMu.Lock()
	defer textMu.Unlock()
	b, err := textTypes.Encode(oid, pgtype.TextFormatCode, v, nil)
	if err != nil {
		panic(fmt.Sprintf("guard: encode %T as text: %v", v, err))
	}
	return b
}

// appliedSQL calls usher_applied_logged with appliedArgs.
func (r *Runner) appliedSQL() string {
	return "SELECT " + r.cfg.Handles.fn("usher_applied_logged") + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
}

func appliedArgs(job *usherv1.Job, d Delivery) []any {
	return []any{d.OutboxID, job.GetKind(), job.GetId(), job.GetAttempt(), d.Deliveries, job.GetRequestId(),
		d.StreamID, d.Consumer, d.Plugin, d.Version, d.Guard, d.Started}
}

// claimSQL is a validated claim spec turned into SQL.
type claimSQL struct {
	claim, status, mark, release string
	// markResult marks done and writes the effect's result into
	// results columns; "" when the claim keeps none.
	markResult string
	results    []string
	keys       []any
	lease      time.Duration
	intent     string
	// key names the claim row: its waiting retries' schedule.Run.WaitsFor.
	key string
}

// claimKey names the claim row spec claims: its table and key columns and
// values.
func claimKey(spec *usherv1.ClaimSpec) string {
	return fmt.Sprintf("%s%q=%v", spec.GetTable(), spec.GetKeyColumns(), contract.FromValues(spec.GetKeyValues()))
}

func buildClaim(spec *usherv1.ClaimSpec) (*claimSQL, error) {
	if spec == nil {
		return nil, errors.New("claim phase returned no claim")
	}
	if len(spec.GetKeyColumns()) == 0 || len(spec.GetKeyColumns()) != len(spec.GetKeyValues()) {
		return nil, fmt.Errorf("claim on %q: %d key columns for %d values", spec.GetTable(), len(spec.GetKeyColumns()), len(spec.GetKeyValues()))
	}
	seen := map[string]bool{}
	for _, name := range append(append([]string{spec.GetClaimedColumn(), spec.GetDoneColumn()}, spec.GetKeyColumns()...), spec.GetResultColumns()...) {
		if !identifier(name) {
			return nil, fmt.Errorf("claim: %q is not a plain SQL identifier", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("claim on %q names column %q twice (key, claimed, done and result columns are distinct)", spec.GetTable(), name)
		}
		seen[name] = true
	}
	if !identifier(spec.GetTable()) {
		return nil, fmt.Errorf("claim: %q is not a plain SQL identifier", spec.GetTable())
	}
	if spec.GetLeaseMs() <= 0 || spec.GetIntent() == "" {
		return nil, fmt.Errorf("claim on %q needs a positive lease and an intent", spec.GetTable())
	}
	t := pgx.Identifier{spec.GetTable()}.Sanitize()
	claimed := pgx.Identifier{spec.GetClaimedColumn()}.Sanitize()
	done := pgx.Identifier{spec.GetDoneColumn()}.Sanitize()
	var cols, params, where []string
	for i, c := range spec.GetKeyColumns() {
		q := pgx.Identifier{c}.Sanitize()
		cols = append(cols, q)
		params = append(params, fmt.Sprintf("$%d", i+1))
		where = append(where, fmt.Sprintf("%s = $%d", q, i+1))
	}
	n := len(cols)
	keyList, whereKeys := strings.Join(cols, ", "), strings.Join(where, " AND ")
	var markResult string
	if rc := spec.GetResultColumns(); len(rc) > 0 {
		set := []string{done + " = now()"}
		for i, c := range rc {
			set = append(set, fmt.Sprintf("%s = $%d", pgx.Identifier{c}.Sanitize(), n+i+1))
		}
		markResult = fmt.Sprintf(`UPDATE %s SET %s WHERE %s AND %s IS NULL`, t, strings.Join(set, ", "), whereKeys, done)
	}
	return &claimSQL{
		markResult: markResult,
		results:    spec.GetResultColumns(),
		// The reference text's one statement: insert, or re-claim only when
		// not done and the claim is older than the lease.
		claim: fmt.Sprintf(`INSERT INTO %[1]s (%[2]s, %[3]s) VALUES (%[4]s, now())
			ON CONFLICT (%[2]s) DO UPDATE SET %[3]s = now()
			WHERE %[1]s.%[5]s IS NULL AND %[1]s.%[3]s < now() - make_interval(secs => $%[6]d)
			RETURNING %[3]s`, t, keyList, claimed, strings.Join(params, ", "), done, n+1),
		// A released claim is '-infinity', which now() cannot be
		// subtracted from: it has no lease left.
		status: fmt.Sprintf(`SELECT %[3]s IS NOT NULL,
			CASE WHEN isfinite(%[2]s) THEN greatest(extract(epoch FROM %[2]s + make_interval(secs => $%[5]d) - now()), 0) ELSE 0 END::float8
			FROM %[1]s WHERE %[4]s`, t, claimed, done, whereKeys, n+1),
		mark:    fmt.Sprintf(`UPDATE %s SET %s = now() WHERE %s AND %s IS NULL`, t, done, whereKeys, done),
		release: fmt.Sprintf(`UPDATE %[1]s SET %[2]s = '-infinity' WHERE %[3]s AND %[4]s IS NULL AND %[2]s = $%[5]d`, t, claimed, whereKeys, done, n+1),
		keys:    contract.FromValues(spec.GetKeyValues()),
		key:     claimKey(spec),
		lease:   time.Duration(spec.GetLeaseMs()) * time.Millisecond,
		intent:  spec.GetIntent(),
	}, nil
}

func identifier(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// claim: the host claims, the plugin sends, the host marks.
func (r *Runner) claim(ctx context.Context, inv Invoker, db DB, job *usherv1.Job, d Delivery) Outcome {
	res, out, ok := r.call(ctx, inv, &usherv1.Call{Phase: usherv1.Phase_PHASE_CLAIM, Job: job})
	if !ok {
		return out
	}
	c, err := buildClaim(res.GetClaim())
	if err != nil {
		return permanent(fmt.Errorf("%s job %s: %w", job.GetKind(), job.GetId(), err))
	}
	// The claim's table and columns come from the plugin's claim spec, so
	// its statements run on the plugin's pool, as its role: a spec naming a
	// table the plugin was not granted is refused by the database.
	leaseSecs := c.lease.Seconds()
	var token time.Time
	err = r.inTxReset(ctx, db, func(b *pgx.Batch) {
		b.Queue(c.claim, append(append([]any{}, c.keys...), leaseSecs)...)
	}, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(&token)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		var done bool
		var remaining float64
		err := r.inTxReset(ctx, db, func(b *pgx.Batch) {
			b.Queue(c.status, append(append([]any{}, c.keys...), leaseSecs)...)
		}, func(br pgx.BatchResults) error {
			return br.QueryRow().Scan(&done, &remaining)
		})
		if err != nil {
			return abandoned(fmt.Errorf("read claim: %w", err))
		}
		if done {
			return absorbed("effect already done")
		}
		wait := max(time.Duration(remaining*float64(time.Second)), 100*time.Millisecond)
		r.cfg.Logger.Info("claim held by another run; retrying after its lease", "job_id", job.GetId(), "kind", job.GetKind(), "retry_in", wait)
		return Outcome{Verdict: Retry, RetryAfter: wait, Reason: "claim held by another run", WaitsFor: c.key}
	}
	if err != nil {
		if out := claimError(err); out != nil {
			return *out
		}
		return abandoned(fmt.Errorf("claim: %w", err))
	}
	ro := r.cfg.Handles.issue(ctx, capReadOnly, job, db.Pool, nil, db.Role)
	eres, out, ok := r.call(ctx, inv, &usherv1.Call{Phase: usherv1.Phase_PHASE_EFFECT, Job: job, Handle: ro.id, IdempotencyKey: c.intent})
	r.cfg.Handles.release(ro)
	if denied, bad := refused(job, ro); bad && ok {
		// The effect ran (and may have left) although a read was refused:
		// mark it done as usual, but report the refusal.
		r.cfg.Logger.Warn("effect succeeded after its role was refused a read", "job_id", job.GetId(), "err", denied.Err)
	} else if bad {
		out = denied
	}
	if !ok {
		if out.Verdict == Retry || out.Verdict == Permanent {
			// The effect reported failure: give the claim back so the
			// retry need not wait out the lease. Should the effect have
			// left anyway, the provider's key catches the resend.
			relCtx := context.WithoutCancel(ctx)
			if err := r.inTxReset(relCtx, db, func(b *pgx.Batch) {
				b.Queue(c.release, append(append([]any{}, c.keys...), token)...)
			}, func(br pgx.BatchResults) error {
				_, err := br.Exec()
				return err
			}); err != nil {
				r.cfg.Logger.Warn("release claim failed; the retry waits out the lease", "job_id", job.GetId(), "err", err)
			} else {
				out.Frees = c.key
			}
		}
		return out
	}
	// Send, then mark: a crash here leaves the claim to go stale and the
	// resend to the provider's idempotency key. The effect's result, when
	// the claim keeps one, is written by the mark itself.
	mark, args := c.mark, c.keys
	vals := eres.GetEffectResult()
	var unkept error
	switch {
	case len(c.results) > 0 && len(vals) == len(c.results):
		mark, args = c.markResult, append(append([]any{}, c.keys...), contract.FromValues(vals)...)
	case len(c.results) > 0 || len(vals) > 0:
		// The effect left: mark it done all the same (nothing sends it
		// again), and dead-letter the job with what was lost.
		unkept = fmt.Errorf("%s job %s: the effect ran and is marked done, but its result was not kept: %d values for the claim's result columns %v",
			job.GetKind(), job.GetId(), len(vals), c.results)
	}
	if v := pluginhost.AnsweredVersion(ctx); v != "" {
		d.Version = v // the version that sent it, swapped in or not
	}
	if err := r.inTxReset(ctx, db, func(b *pgx.Batch) {
		b.Queue(mark, args...)
		if d.OutboxID != 0 {
			b.Queue(r.appliedSQL(), appliedArgs(job, d)...)
		}
	}, func(br pgx.BatchResults) error {
		_, err := br.Exec()
		if err == nil && d.OutboxID != 0 {
			_, err = br.Exec()
		}
		return err
	}); err != nil {
		if out := claimError(err); out != nil {
			// A mark that can never work (a result column the role
			// may not write): the effect left; say so.
			o := permanent(fmt.Errorf("%s job %s: the effect ran but cannot be marked done: %w", job.GetKind(), job.GetId(), err))
			return o
		}
		return abandoned(fmt.Errorf("mark done: %w", err))
	}
	if unkept != nil {
		o := permanent(unkept)
		o.Frees = c.key
		return o
	}
	o := applied(d)
	o.Frees = c.key
	return o
}

// inTxReset runs the statements queue adds in a transaction of their own
// on db's pool, their COMMIT and the session's reset in one round trip
// after the BEGIN's (withReset): two round trips where a transaction and
// the pool's reset took five or more. (BEGIN by itself first: a statement
// the pool has not described on the connection is parsed before the
// batch, and a cast in it can run the plugin's code, a domain's check on
// a column of its table; that belongs inside the transaction.) read reads
// the statements' results, in order; an error it returns (pgx.ErrNoRows
// from a claim lost, say) is returned as it is.
func (r *Runner) inTxReset(ctx context.Context, db DB, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	return withReset(ctx, db.Pool, r.cfg.Handles.schema, "BEGIN", func(b *pgx.Batch) {
		queue(b)
		b.Queue("COMMIT")
	}, func(br pgx.BatchResults) error {
		if err := read(br); err != nil {
			return err
		}
		tag, err := br.Exec()
		if err == nil && tag.String() != "COMMIT" {
			err = errors.New("the transaction was rolled back")
		}
		return err
	})
}

// claimError turns a claim statement that can never work (no such table or
// column, no unique constraint on the key) into a permanent failure.
func claimError(err error) *Outcome {
	if st := sqlStatus(err); st != nil && (strings.Contains(st.Error(), "InvalidArgument") || strings.Contains(st.Error(), "PermissionDenied")) {
		o := permanent(fmt.Errorf("claim statement refused: %w", err))
		return &o
	}
	return nil
}

package guard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/usherhq/usher/host/pluginhost"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Batches of record-the-job-id runs.
//
// The jobs of one plugin's pool that record their id (guard 4) wait for a
// batch instead of opening a transaction each: one goroutine per pool takes
// whatever jobs are waiting (at most BatchMax, after a wait of GatherWait
// at most for the jobs that will join it, see gather) and runs them in one
// transaction with one Invoke, in three round trips whatever their number:
// BEGIN with every job's record, the writes the applies returned, and the
// outcomes with the COMMIT. A job whose id was recorded before is absorbed
// at the first. Anything else that is not a clean apply of every job (an
// answer other than OK, a write that fails or affects too few rows, a
// refusal, a failed commit) rolls the batch back: a batch never commits a
// job that would not have committed alone. The jobs whose own answer,
// write or refusal failed it run again by themselves, where each gets its
// own outcome, and the others go back to the queue for the next batch
// (againBatched), once at most; a failure that is no job's own (a failed
// commit) runs each job again by itself. One job's failure costs the
// others a second run, not a retry. A crash of the plugin abandons every
// job of the batch, as it does the jobs in flight beside a single one;
// those run again alone (Config.Solo) until they apply, so a job that
// crashes its plugin is found by itself.
//
// One batch at a time per pool sends its writes: a batch starts when the
// one before it has sent all of its own and waits for nothing but its
// COMMIT, so the batches of a plugin never wait on each other's row locks
// in a cycle and do not deadlock (but for one overtaken, below: its writes
// may meet its successor's, and a cycle between them is the server's to
// break, as one with another host's batch is), and a commit's round trip and flush
// overlap the next batch's record, call and writes. (Starting the next
// batch earlier still, its record and call overlapping this one's call
// and writes, was measured: batches halved, and 16 jobs in flight ran 14 %
// slower.) Another entry of a job already in a batch not over waits in the
// queue until that batch is over, then meets its record. A batch that runs
// past its pool's call-off time (callOffAfter: a few times the slowest of
// its pool's recent calls, StalledAfter at most) is called off: its Invoke
// is cancelled, its transaction rolled back, and each of its jobs runs
// again alone, so a handler that hangs holds only its own job, and its
// batch-mates and the next batch wait tens of milliseconds for it, not
// StalledAfter.

// BatchReport is what Config.OnBatch is told of a batch that reached its
// plugin.
type BatchReport struct {
	// Role is the plugin's database role.
	Role string
	// Jobs are the batch's jobs, absorbed ones excluded.
	Jobs int
	// Committed: the batch committed whole; otherwise it was split to
	// run each job alone.
	Committed bool
	// Phases, for a committed batch: how long each of its steps took.
	Phases BatchPhases
}

// BatchPhases are the steps of a committed batch, each a round trip: its
// BEGIN with the jobs' records (the connection's acquisition included),
// the plugin's call, the writes the applies returned, and the COMMIT with
// the outcomes and the session's reset.
type BatchPhases struct {
	Record, Invoke, Writes, Commit time.Duration
}

// batchOpening is a batch's BEGIN with its jobs' records, sent while the
// plugin applies them; done is closed when it is over.
type batchOpening struct {
	done chan struct{}
	err  error
	// recorded[i]: job i's id was recorded now, not before.
	recorded []bool
}

// batchReq is one job waiting for its batch.
type batchReq struct {
	ctx  context.Context
	inv  Invoker
	db   DB
	job  *usherv1.Job
	d    Delivery
	out  Outcome
	done chan struct{}
	// again: put back in the queue once already, by a batch that a
	// batch-mate's answer split (againBatched); the next split runs it
	// alone.
	again bool
}

// batcher queues the jobs of one pool.
type batcher struct {
	mu      sync.Mutex
	queue   []*batchReq
	running bool
	// inflight counts the entries of each job (kind, id) in the batches
	// started and not over: another entry of the same job waits in the
	// queue until they are, then meets their record.
	inflight map[[2]string]int
	// lastOver is when the last batch was over, and lastSize its jobs:
	// their successors are being read (gather).
	lastOver time.Time
	lastSize int
	// queued has a value when a job was queued since gather last looked.
	queued chan struct{}
	// calls are how long the plugin took to answer the last committed
	// batches, and how many jobs each had, newest at calls[next-1];
	// calledOff counts the batches called off since the last one
	// committed (callOffAfter).
	calls     [callOffWindow]call
	next      int
	calledOff int
}

// call is how long the plugin took to answer a committed batch of jobs.
type call struct {
	took time.Duration
	jobs int
}

// scaled is how long c would take for a batch of n jobs, for the times a
// batch is given: as long for fewer jobs, and longer for more by the
// square root of how many times more. A call is a fixed part and a part
// per job, so c's time per job (took/jobs) times n overstates a bigger
// batch's; by that much that, after batches of one on a loaded machine, a
// batch of five holding a stalled job was called off only at StalledAfter
// (TestStalledJobHoldsOnlyItself failed a CI so). The square root still
// covers a call all of whose time grows with its jobs, for up to 400
// times c's jobs (callOffFactor * sqrt(r) >= r), BatchMax's 128 within.
func (c call) scaled(n int) time.Duration {
	if n <= c.jobs {
		return c.took
	}
	return time.Duration(float64(c.took) * math.Sqrt(float64(n)/float64(c.jobs)))
}

// A batch is called off when its call runs past callOffFactor times the
// slowest of its pool's last callOffWindow committed calls (per job, times
// its own jobs), and never before callOffFloor: a handler that hangs is
// told from a batch that is merely slow within a tenth of a second or so. Each batch called off in a
// row doubles the time (a plugin slowed down as a whole, a loaded machine,
// soon runs its batches whole again), up to StalledAfter. Much sooner, at
// overtakeFactor times the median of those calls (overtakeFloor at
// least), the next batch starts without waiting for it, so the jobs that
// arrive meanwhile wait for nothing but their own batch. Overtaking costs
// a second batch in the plugin at once and, rarely, a deadlock between
// the two batches' writes that the server breaks (deadlock_timeout) and
// that splits them; it goes by the usual call, not the slowest. (Making
// the overtaken batch wait for its turn to write on a mutex of the host's
// hid such a cycle from the server: a handler's own statements, run in
// its batch's transaction during the call, hold row locks before the
// batch's turn.)
const (
	callOffWindow  = 32
	callOffFactor  = 20
	callOffFloor   = 100 * time.Millisecond
	overtakeFactor = 4
	overtakeFloor  = 2 * time.Millisecond
)

// batchTimes are how long b's next batch, of n jobs, may run before the
// next one overtakes it, and before it is called off. The calls known are
// scaled to n jobs (call.scaled), so that a batch of 128 after a run of
// batches of 5 is given time for 128: a handler's work, and its
// statements sent back one at a time in the batch's transaction, grow
// with the jobs.
func (r *Runner) batchTimes(b *batcher, n int) (overtake, callOff time.Duration) {
	b.mu.Lock()
	calls, calledOff := b.calls, b.calledOff
	b.mu.Unlock()
	var known []time.Duration
	for _, c := range calls {
		if c.jobs > 0 {
			known = append(known, c.scaled(max(n, 1)))
		}
	}
	if len(known) == 0 {
		return r.cfg.StalledAfter, r.cfg.StalledAfter // nothing known of this pool yet
	}
	slices.Sort(known)
	median, slowest := known[len(known)/2], known[len(known)-1]
	backoff := min(calledOff, 16)
	callOff = min(max(callOffFactor*slowest, callOffFloor)<<backoff, r.cfg.StalledAfter)
	overtake = min(max(overtakeFactor*median, overtakeFloor)<<backoff, callOff)
	return overtake, callOff
}

// answered records how long a committed batch's call of n jobs took.
func (b *batcher) answered(d time.Duration, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls[b.next] = call{took: max(d, 1), jobs: max(n, 1)}
	b.next = (b.next + 1) % callOffWindow
	b.calledOff = 0
}

func (b *batcher) calledOffOne() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calledOff++
}

// jobIDBatched runs job in the next batch of its pool and returns its
// outcome.
func (r *Runner) jobIDBatched(ctx context.Context, inv Invoker, db DB, job *usherv1.Job, d Delivery) Outcome {
	v, ok := r.batchers.Load(db.Pool)
	if !ok {
		v, _ = r.batchers.LoadOrStore(db.Pool, &batcher{queued: make(chan struct{}, 1)})
	}
	b := v.(*batcher)
	q := &batchReq{ctx: ctx, inv: inv, db: db, job: job, d: d, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, q)
	if !b.running {
		b.running = true
		go r.drain(b)
	}
	b.mu.Unlock()
	d.arrive()
	select {
	case b.queued <- struct{}{}:
	default:
	}
	<-q.done
	return q.out
}

// drain runs b's batches until its queue is empty.
func (r *Runner) drain(b *batcher) {
	for {
		r.gather(b)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := r.take(b)
		if len(batch) == 0 {
			// Every job waiting has another entry in a batch not over:
			// the end of that batch starts the drain again (over).
			b.running = false
			b.mu.Unlock()
			return
		}
		done := make(chan struct{})
		b.mu.Unlock()
		ctx, stop, release := batchContext(batch)
		next := make(chan struct{})
		var once sync.Once
		// The next batch starts when this one has sent its writes (its
		// commit, a round trip and a flush to disk, overlaps the next
		// one's record, call and writes), when its call has taken so long
		// that the next one overtakes it (one of its jobs may hang:
		// batchTimes), or when it is over.
		free := func() { once.Do(func() { close(next) }) }
		// The plugin's call has a context of its own, which a call-off
		// cancels: the batch's writes and commit never see it.
		callCtx, callOff := context.WithCancelCause(ctx)
		calling, answered := make(chan struct{}), make(chan struct{})
		w := watched{calling: sync.OnceFunc(func() { close(calling) }), answered: sync.OnceFunc(func() { close(answered) })}
		go func() {
			defer close(done)
			defer r.over(b, batch)
			defer free()
			defer release()
			defer stop(nil)
			defer callOff(nil)
			defer w.answered() // a batch that never reached the plugin is not called off
			r.runBatch(ctx, callCtx, b, batch, free, w)
		}()
		go r.watch(b, len(batch), done, calling, answered, free, callOff)
		<-next
	}
}

// watched is how runBatch tells watch where its batch is: calling when
// its call to the plugin starts, answered when the plugin has answered.
type watched struct {
	calling, answered func()
}

// watch lets the next batch overtake this one, and calls this one off,
// when its plugin takes long to answer (batchTimes): overtaken that long
// after the batch started, called off that long after its call did. A
// batch of one job is overtaken, never called off (it has no batch-mates
// to free). Once the plugin has answered, the next batch waits for this
// one's writes, for StalledAfter at most (they wait on row locks, or its
// commit on the disk); nothing calls the batch off then.
func (r *Runner) watch(b *batcher, n int, done, calling, answered <-chan struct{}, free func(), callOff context.CancelCauseFunc) {
	lone := n == 1
	overtake, offAfter := r.batchTimes(b, n)
	start := time.Now()
	t := time.NewTimer(overtake)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-answered:
		t.Reset(r.cfg.StalledAfter - time.Since(start))
		select {
		case <-done:
		case <-t.C:
			free()
		}
		return
	case <-t.C:
		free()
	}
	if lone {
		return
	}
	select {
	case <-done:
		return
	case <-answered:
		return
	case <-calling:
	}
	t.Reset(offAfter)
	select {
	case <-done:
	case <-answered:
	case <-t.C:
		select {
		case <-answered: // at the same moment: it answered
		default:
			b.calledOffOne()
			callOff(errBatchStalled)
		}
	}
}

// gather waits, briefly, for the jobs that will join the batch about to
// start. The slots of a batch's jobs come back together, and the entries
// read for them arrive over a read or two: the first to arrive started a
// batch of its own, and the others waited behind it for the next. At 16
// jobs in flight the batches had settled into a batch of 15 and a single
// job, one after the other, each in a transaction of its own (bin/bench,
// a histogram of batch sizes). So it waits while jobs read from the
// stream are still on their way to the queue (Config.Arriving), and, for
// GatherWait after a batch was over, until as many jobs as it had are
// queued; never for more than BatchMax, nor longer than GatherWait. It
// wakes when a job is queued or the count of those arriving falls to 0,
// not on a timer: a timer shorter than a millisecond fires a millisecond
// late on a process with nothing else to do, and polling every 100µs made
// the batches of 16 jobs in flight wait ~1.8 ms after the read that
// brought their last job, a third of their cycle (scratch timers, bin/bench
// --inflight 16). A job that finds no read in progress and no batch just
// over starts at once; one that comes during a read waits for it (one
// round trip to Redis, even when it finds nothing), and one that comes
// just after a batch of several jobs is over waits for its batch-mates,
// or GatherWait in vain.
func (r *Runner) gather(b *batcher) {
	if r.cfg.Arriving == nil || r.cfg.GatherWait < 0 {
		return
	}
	var timeout <-chan time.Time
	for {
		arriving, zero := r.cfg.Arriving()
		b.mu.Lock()
		n, want := len(b.queue), 0
		if time.Since(b.lastOver) < r.cfg.GatherWait {
			want = b.lastSize
		}
		b.mu.Unlock()
		if n >= r.cfg.BatchMax || arriving == 0 && n >= want {
			return
		}
		if timeout == nil {
			t := time.NewTimer(r.cfg.GatherWait)
			defer t.Stop()
			timeout = t.C
		}
		if arriving == 0 {
			zero = nil // only a job queued can change the answer
		}
		select {
		case <-b.queued:
		case <-zero:
		case <-timeout:
			return
		}
	}
}

// batchContext is the context batch runs in. The last job's deadline is
// the batch's: it came last, so it is the latest (every job has the same
// timeout), and a batch that runs out of time has run out every job's own,
// which the host then reports as timed out, not as unfinished. It is
// cancelled when the contexts of all its jobs are (the host shutting
// down), not when one of them is: a job absorbed at the record finishes
// at once, and its context ends with it, while its batch-mates still run
// (a batch that inherited its cancellation lost its commit's answer, and
// ran its committed jobs again alone). It keeps the last job's values,
// its hold on the plugin's gate among them (pluginhost.Gate): every job
// of the batch holds the gate until its outcome is back, so the batch's
// call runs under their holds and does not wait at the gate again.
// release frees what watches them.
func batchContext(batch []*batchReq) (ctx context.Context, stop context.CancelCauseFunc, release func()) {
	last := batch[len(batch)-1].ctx
	base, cancel := context.WithoutCancel(last), context.CancelFunc(func() {})
	if dl, ok := last.Deadline(); ok {
		base, cancel = context.WithDeadline(base, dl)
	}
	ctx, stop = context.WithCancelCause(base)
	var left atomic.Int32
	left.Store(int32(len(batch)))
	unwatch := make([]func() bool, len(batch))
	for i, q := range batch {
		unwatch[i] = context.AfterFunc(q.ctx, func() {
			if left.Add(-1) == 0 {
				stop(context.Cause(q.ctx))
			}
		})
	}
	return ctx, stop, func() {
		for _, u := range unwatch {
			u()
		}
		cancel()
	}
}

// batchBytes bounds one batch's jobs together, as encoded (their
// payloads, ids, request ids and traces): half of contract.MaxMessageBytes,
// the gRPC limit its one Invoke must fit in, so the call carries them with
// room for the rest of the message. A job larger alone (entry.MaxBytes
// allows a megabyte, far below it) is still taken, by itself.
const batchBytes = contract.MaxMessageBytes / 2

// take takes the next batch from b's queue (b.mu held): jobs of one plugin
// process (a swap can leave jobs of the old and the new one waiting on the
// same pool), at most BatchMax and batchBytes of jobs, none of a
// job with another entry in a batch not over. It is empty when every job
// waiting has such an entry.
func (r *Runner) take(b *batcher) []*batchReq {
	if b.inflight == nil {
		b.inflight = map[[2]string]int{}
	}
	var inv Invoker
	var batch, rest []*batchReq
	bytes := 0
	for _, q := range b.queue {
		k := jobKey(q)
		size := proto.Size(q.job)
		switch {
		case len(batch) >= r.cfg.BatchMax, inv != nil && q.inv != inv, b.inflight[k] > 0,
			len(batch) > 0 && bytes+size > batchBytes:
			rest = append(rest, q)
		default:
			inv = q.inv
			batch = append(batch, q)
			bytes += size
			b.inflight[k]++
		}
	}
	b.queue = rest
	return batch
}

// over forgets batch's jobs in flight, and starts b's drain again when
// jobs wait and none drains them (they waited for this batch).
func (r *Runner) over(b *batcher, batch []*batchReq) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastOver, b.lastSize = time.Now(), len(batch)
	for _, q := range batch {
		k := jobKey(q)
		if b.inflight[k]--; b.inflight[k] <= 0 {
			delete(b.inflight, k)
		}
	}
	if len(b.queue) > 0 && !b.running {
		b.running = true
		go r.drain(b)
	}
}

func jobKey(q *batchReq) [2]string { return [2]string{q.job.GetKind(), q.job.GetId()} }

// errBatchStalled calls off a batch whose plugin ran past its call-off
// time (batchTimes).
var errBatchStalled = errors.New("batch stalled")

func finish(q *batchReq, out Outcome) {
	q.out = out
	close(q.done)
}

// alone runs each job of batch by itself, at once, and waits for them.
func (r *Runner) alone(batch []*batchReq) {
	var wg sync.WaitGroup
	for _, q := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			finish(q, r.jobIDOne(q.ctx, q.inv, q.db, q.job, q.d))
		}()
	}
	wg.Wait()
}

// runBatch runs batch's jobs in one transaction, or each alone when they
// cannot all apply together.
//
// written is called once the batch's writes have all run and it is about
// to commit: from then on it takes no row lock of the plugin's tables (its
// commit records only its own jobs' outcomes), so the next batch may
// start, and wait on this one's row locks if it must. (A deferred check of
// the plugin's tables at COMMIT can still wait on another transaction; the
// database's deadlock detector breaks such a cycle, and the batch's jobs
// run again alone.)
// A batch that splits holds its pool until its jobs have run alone.
//
// The plugin's call runs in callCtx, which a call-off cancels; w is told
// when it starts and when the plugin has answered.
func (r *Runner) runBatch(ctx, callCtx context.Context, b *batcher, batch []*batchReq, written func(), w watched) {
	if len(batch) == 1 {
		r.alone(batch)
		return
	}
	first := batch[0]
	var phases BatchPhases
	lap := func(d *time.Duration) func() {
		start := time.Now()
		return func() { *d = time.Since(start) }
	}
	tx, err := acquireTx(ctx, first.db.Pool, r.cfg.Handles.schema)
	if err != nil {
		r.alone(batch)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The transaction opens, with every job's record, while the plugin
	// applies them: a statement the plugin sends meanwhile waits for
	// open.done (handle.opened), as the writes below do.
	open := &batchOpening{done: make(chan struct{}), recorded: make([]bool, len(batch))}
	var txMu sync.Mutex
	all := make([]*handle, len(batch))
	allCalls := make([]*usherv1.Call, len(batch))
	for i, q := range batch {
		h := r.cfg.Handles.issue(q.ctx, capApply, q.job, q.db.Pool, tx, q.db.Role)
		h.txMu, h.opening, h.slot = &txMu, open, i
		all[i] = h
		allCalls[i] = &usherv1.Call{Phase: usherv1.Phase_PHASE_APPLY, Job: q.job, Handle: h.id}
	}
	go func() {
		defer close(open.done)
		defer lap(&phases.Record)()
		open.err = tx.begin(ctx, r.recordJobs(batch, open.recorded))
	}()
	done := lap(&phases.Invoke)
	actx := pluginhost.WithAnswered(callCtx)
	w.calling()
	answers, err := first.inv.Invoke(actx, allCalls)
	w.answered()
	version := pluginhost.AnsweredVersion(actx)
	done()
	<-open.done
	if open.err != nil {
		for _, h := range all {
			r.cfg.Handles.release(h)
		}
		// Its connection back first: the jobs alone need one each.
		tx.Rollback(context.WithoutCancel(ctx))
		r.alone(batch)
		return
	}
	// A job recorded before is absorbed: its answer is dropped (its
	// statements were refused, handle.opened).
	var (
		run   []*batchReq
		hs    []*handle
		calls []*usherv1.Call
		res   []*usherv1.Result
	)
	whole := len(answers) == len(allCalls) // else garbage: the batch splits below
	for i, q := range batch {
		if !open.recorded[i] {
			r.cfg.Handles.release(all[i])
			finish(q, absorbed("job id already recorded"))
			continue
		}
		run, hs, calls = append(run, q), append(hs, all[i]), append(calls, allCalls[i])
		if whole {
			res = append(res, answers[i])
		}
	}
	if len(run) == 0 {
		return
	}
	release := func() {
		for _, h := range hs {
			r.cfg.Handles.release(h)
		}
	}
	if err != nil && context.Cause(callCtx) != errBatchStalled && !pluginhost.TooLarge(err) {
		release()
		r.observe(first.db, len(run), nil) // they run again alone
		for _, q := range run {
			finish(q, abandoned(fmt.Errorf("apply of %s job %s did not complete: %w", q.job.GetKind(), q.job.GetId(), err)))
		}
		return
	}
	// Called off as stalled (err set), not crashed: one of the jobs hangs,
	// and the batch splits below like any batch that cannot apply whole;
	// alone, the hanging job holds only itself. So does a batch whose
	// call or answer was over the gRPC message cap (pluginhost.TooLarge): abandoned,
	// its jobs would meet again in the same batch after their reclaim,
	// until their deliveries ran out; alone, each fits, or is the one
	// that does not.
	ok := err == nil && len(res) == len(calls)
	parts := make([]*writePart, len(run))
	// failed marks the jobs whose own answer or writes split the batch.
	var failed []bool
	for i := 0; ok && i < len(run); i++ {
		good := res[i] != nil
		if good {
			_, good = r.result(calls[i], res[i])
			parts[i] = &writePart{h: hs[i], ws: res[i].GetWrites()}
		}
		if !good {
			failed = markFailed(failed, len(run), i)
		}
	}
	// Every job answered a clean apply (else the call failed, was called
	// off or a job's answer split the batch: no writes run).
	ok = ok && failed == nil
	answered := ok
	if ok {
		done = lap(&phases.Writes)
		ok = r.cfg.Handles.writeAll(inLockOrder(parts))
		done()
	}
	// The jobs whose own writes failed, or were refused: not those whose
	// writes did not run because another's stopped the batch first.
	for i := 0; answered && i < len(run); i++ {
		if out, good := r.written(run[i].job, parts[i]); !good && out.Verdict != Abandoned {
			failed = markFailed(failed, len(run), i)
		}
	}
	release()
	for i := 0; answered && i < len(run); i++ {
		if _, bad := refused(run[i].job, hs[i]); bad {
			failed = markFailed(failed, len(run), i)
		}
	}
	if !ok || failed != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		r.observe(first.db, len(run), nil)
		// A failure that is no job's own runs every job alone.
		if failed != nil {
			run = r.againBatched(b, run, failed)
		}
		r.alone(run)
		return
	}
	written()
	jobs, ds := make([]*usherv1.Job, len(run)), make([]Delivery, len(run))
	for i, q := range run {
		if version != "" {
			q.d.Version = version // the version that ran it, swapped in or not
		}
		jobs[i], ds[i] = q.job, q.d
	}
	done = lap(&phases.Commit)
	if err := tx.Commit(ctx, r.outcomes(jobs, ds)...); err != nil {
		// Committed or not, each job's record decides when it runs
		// again: applied once, or absorbed.
		r.observe(first.db, len(run), nil)
		r.alone(run)
		return
	}
	done()
	b.answered(phases.Invoke, len(allCalls))
	r.observe(first.db, len(run), &phases)
	for _, q := range run {
		out := applied(q.d)
		out.Version = q.d.Version
		finish(q, out)
	}
}

// markFailed marks job i of n as failed, making the marks when there are
// none yet.
func markFailed(failed []bool, n, i int) []bool {
	if failed == nil {
		failed = make([]bool, n)
	}
	failed[i] = true
	return failed
}

// againBatched splits a batch whose plugin answered some of its jobs
// (failed) with anything but a clean apply: those jobs, and the others
// that a split put back once already, are returned to run alone, where
// each gets its own outcome; the others go back to the front of the queue
// to meet in the next batch, which starts once this one is over (the
// batch's entries in flight hold them until then). One failing job of a
// batch of BatchMax then costs its batch-mates one batch more, not a
// transaction each; a job is put back once at most, so a plugin failing
// a job in every batch cannot hold the others in the queue.
func (r *Runner) againBatched(b *batcher, run []*batchReq, failed []bool) (alone []*batchReq) {
	var back []*batchReq
	for i, q := range run {
		if failed[i] || q.again {
			alone = append(alone, q)
			continue
		}
		q.again = true
		back = append(back, q)
	}
	if len(back) < 2 {
		return append(alone, back...) // a batch of one is a job alone
	}
	b.mu.Lock()
	b.queue = append(back, b.queue...)
	b.mu.Unlock()
	return alone
}

// inLockOrder is parts in the order their writes are sent: by their first
// write's SQL and arguments, the same order on every host. The jobs of a
// batch are independent, so their order is free, and two batches (of two
// hosts, or a batch and the one that overtook it) whose jobs each write
// one row named by their first write's first argument lock shared rows in
// the same order, never in a cycle. The counter's write names its event
// first: three hosts over 100 events had deadlocked 3 times in 2,400 jobs,
// each time a batch rolled back after the server's deadlock_timeout and
// its jobs ran again alone (TestHostsSharingRowsDoNotDeadlock).
func inLockOrder(parts []*writePart) []*writePart {
	keys := make(map[*writePart]string, len(parts))
	for _, p := range parts {
		keys[p] = lockKey(p)
	}
	sorted := slices.Clone(parts)
	slices.SortStableFunc(sorted, func(a, b *writePart) int { return strings.Compare(keys[a], keys[b]) })
	return sorted
}

// lockKey is a part's first write, its SQL and its arguments' values.
func lockKey(p *writePart) string {
	if len(p.ws) == 0 {
		return ""
	}
	var k strings.Builder
	k.WriteString(p.ws[0].GetSql())
	for _, a := range p.ws[0].GetArgs() {
		k.WriteByte(0)
		// Not a.String(): protobuf's text output varies from one
		// process to the next on purpose.
		switch v := a.GetKind().(type) {
		case *usherv1.Value_Int:
			k.WriteString(strconv.FormatInt(v.Int, 10))
		case *usherv1.Value_Text:
			k.WriteString(v.Text)
		case *usherv1.Value_Float:
			k.WriteString(strconv.FormatFloat(v.Float, 'g', -1, 64))
		case *usherv1.Value_Bytes:
			k.Write(v.Bytes)
		case *usherv1.Value_Bool:
			k.WriteString(strconv.FormatBool(v.Bool))
		case *usherv1.Value_TimeUnixNanos:
			k.WriteString(strconv.FormatInt(v.TimeUnixNanos, 10))
		}
	}
	return k.String()
}

// recordJobs records the ids of batch's jobs in its transaction, in one
// statement; recorded[i] is false when job i was recorded before.
func (r *Runner) recordJobs(batch []*batchReq, recorded []bool) opening {
	ids, kinds := make([]string, len(batch)), make([]string, len(batch))
	for i, q := range batch {
		ids[i], kinds[i] = q.job.GetId(), q.job.GetKind()
	}
	return opening{sql: "SELECT " + r.cfg.Handles.fn("usher_record_jobs") + "($1, $2)", args: []any{ids, kinds},
		scan: func(row pgx.Row) error {
			var got []bool
			if err := row.Scan(&got); err != nil {
				return err
			}
			if len(got) != len(recorded) {
				return fmt.Errorf("usher_record_jobs answered %d records for %d jobs", len(got), len(recorded))
			}
			copy(recorded, got)
			return nil
		}}
}

// observe tells OnBatch of a batch of jobs: committed with phases, or
// split (nil).
func (r *Runner) observe(db DB, jobs int, phases *BatchPhases) {
	if r.cfg.OnBatch == nil || jobs <= 1 {
		return
	}
	rep := BatchReport{Role: db.Role, Jobs: jobs, Committed: phases != nil}
	if phases != nil {
		rep.Phases = *phases
	}
	r.cfg.OnBatch(rep)
}

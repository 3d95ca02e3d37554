package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Batches of record-the-job-id runs.
//
// The jobs of one plugin's pool that record their id (guard 4) wait for a
// batch instead of opening a transaction each: one goroutine per pool takes
// whatever jobs are waiting (at most BatchMax, nothing waits for more) and
// runs them in one transaction with one Invoke, in three round trips
// whatever their number: BEGIN with every job's record, the writes the
// applies returned, and the outcomes with the COMMIT. A job whose id was
// recorded before is absorbed at the first. Anything else that is not a
// clean apply of every job (an answer other than OK, a write that fails or
// affects too few rows, a refusal, a failed commit) rolls the batch back and
// runs each of its jobs again by itself, where it gets its own outcome: a
// batch never commits a job that would not have committed alone, and one
// job's failure costs the others a second run, not a retry. A crash of the
// plugin abandons every job of the batch, as it does the jobs in flight
// beside a single one; those run again alone (Config.Solo) until they
// apply, so a job that crashes its plugin is found by itself.
//
// One batch at a time per pool sends its writes: a batch starts only when
// the one before it has sent all of its own and waits for nothing but its
// COMMIT, so the batches of a plugin never wait on each other's row locks
// in a cycle and do not deadlock, and a commit's round trip and flush
// overlap the next batch's record, call and writes. A batch that runs past
// StalledAfter is called off: its Invoke is cancelled, its transaction
// rolled back, and each of its jobs runs again alone, so a handler that
// hangs holds only its own job, never its batch-mates nor the next batch.

// batchReq is one job waiting for its batch.
type batchReq struct {
	ctx  context.Context
	inv  Invoker
	db   DB
	job  *usherv1.Job
	d    Delivery
	out  Outcome
	done chan struct{}
}

// batcher queues the jobs of one pool.
type batcher struct {
	mu      sync.Mutex
	queue   []*batchReq
	running bool
}

// jobIDBatched runs job in the next batch of its pool and returns its
// outcome.
func (r *Runner) jobIDBatched(ctx context.Context, inv Invoker, db DB, job *usherv1.Job, d Delivery) Outcome {
	v, _ := r.batchers.LoadOrStore(db.Pool, &batcher{})
	b := v.(*batcher)
	q := &batchReq{ctx: ctx, inv: inv, db: db, job: job, d: d, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, q)
	if !b.running {
		b.running = true
		go r.drain(b)
	}
	b.mu.Unlock()
	<-q.done
	return q.out
}

// drain runs b's batches until its queue is empty.
func (r *Runner) drain(b *batcher) {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		// The jobs of one plugin process: a swap can leave jobs of the
		// old and the new one waiting on the same pool.
		inv := b.queue[0].inv
		var batch, rest []*batchReq
		for _, q := range b.queue {
			if len(batch) < r.cfg.BatchMax && q.inv == inv {
				batch = append(batch, q)
			} else {
				rest = append(rest, q)
			}
		}
		b.queue = rest
		b.mu.Unlock()
		// The last job's deadline is the batch's: it came last, so it is
		// the latest (every job has the same timeout), and a batch that
		// runs out of time has run out every job's own, which the host
		// then reports as timed out, not as unfinished.
		ctx, stop := context.WithCancelCause(batch[len(batch)-1].ctx)
		done, next := make(chan struct{}), make(chan struct{})
		var once sync.Once
		// The next batch starts when this one has sent its writes (its
		// commit, a round trip and a flush to disk, overlaps the next
		// one's record, call and writes), when it is called off as
		// stalled (its jobs run alone, and one of them hangs), or when it
		// is over.
		free := func() { once.Do(func() { close(next) }) }
		go func() {
			defer close(done)
			defer free()
			defer stop(nil)
			r.runBatch(ctx, batch, free)
		}()
		go func() {
			t := time.NewTimer(r.cfg.StalledAfter)
			defer t.Stop()
			select {
			case <-done:
			case <-t.C:
				stop(errBatchStalled)
				free()
			}
		}()
		<-next
	}
}

// errBatchStalled calls off a batch that ran past StalledAfter.
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
// to commit: from then on it waits on no row lock another batch can hold
// (its commit records only its own jobs' outcomes), so the next batch may
// start, and wait on this one's row locks if it must, without a deadlock.
// A batch that splits holds its pool until its jobs have run alone.
func (r *Runner) runBatch(ctx context.Context, batch []*batchReq, written func()) {
	if len(batch) == 1 {
		r.alone(batch)
		return
	}
	// A job id twice in one batch (two entries of one job): the second
	// runs alone after the batch, when the first's record has committed
	// or rolled back, and is absorbed or applies as it would have alone.
	batch, twice := distinctJobs(batch)
	if len(twice) > 0 {
		defer r.alone(twice)
	}
	first := batch[0]
	recorded := make([]bool, len(batch))
	tx, err := beginWith(ctx, first.db.Pool, r.cfg.Handles.schema, r.recordJobs(batch, recorded))
	if err != nil {
		r.alone(batch)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var (
		run   []*batchReq
		hs    []*handle
		calls []*usherv1.Call
		txMu  sync.Mutex
	)
	for i, q := range batch {
		if !recorded[i] {
			finish(q, absorbed("job id already recorded"))
			continue
		}
		h := r.cfg.Handles.issue(q.ctx, capApply, q.job, q.db.Pool, tx, q.db.Role)
		h.txMu = &txMu
		run, hs = append(run, q), append(hs, h)
		calls = append(calls, &usherv1.Call{Phase: usherv1.Phase_PHASE_APPLY, Job: q.job, Handle: h.id})
	}
	if len(run) == 0 {
		return
	}
	release := func() {
		for _, h := range hs {
			r.cfg.Handles.release(h)
		}
	}
	res, err := first.inv.Invoke(ctx, calls)
	if err != nil && context.Cause(ctx) != errBatchStalled {
		release()
		r.observe(first.db, len(run), false) // they run again alone
		for _, q := range run {
			finish(q, abandoned(fmt.Errorf("apply of %s job %s did not complete: %w", q.job.GetKind(), q.job.GetId(), err)))
		}
		return
	}
	// Called off as stalled (err set), not crashed: one of the jobs hangs,
	// and the batch splits below like any batch that cannot apply whole;
	// alone, the hanging job holds only itself.
	ok := err == nil && len(res) == len(calls)
	parts := make([]*writePart, len(run))
	for i := 0; ok && i < len(run); i++ {
		if res[i] == nil {
			ok = false
			break
		}
		_, ok = r.result(calls[i], res[i])
		parts[i] = &writePart{h: hs[i], ws: res[i].GetWrites()}
	}
	if ok {
		ok = r.cfg.Handles.writeAll(parts)
	}
	for i := 0; ok && i < len(run); i++ {
		_, ok = r.written(run[i].job, parts[i])
	}
	release()
	for i := 0; ok && i < len(run); i++ {
		_, bad := refused(run[i].job, hs[i])
		ok = !bad
	}
	if !ok {
		tx.Rollback(context.WithoutCancel(ctx))
		r.observe(first.db, len(run), false)
		r.alone(run)
		return
	}
	written()
	jobs, ds := make([]*usherv1.Job, len(run)), make([]Delivery, len(run))
	for i, q := range run {
		jobs[i], ds[i] = q.job, q.d
	}
	if err := tx.Commit(ctx, r.outcomes(jobs, ds)...); err != nil {
		// Committed or not, each job's record decides when it runs
		// again: applied once, or absorbed.
		r.observe(first.db, len(run), false)
		r.alone(run)
		return
	}
	r.observe(first.db, len(run), true)
	for _, q := range run {
		finish(q, Outcome{Verdict: Applied, Recorded: q.d.OutboxID != 0})
	}
}

// distinctJobs splits batch into its first entry of each job and the
// entries of a job already in it.
func distinctJobs(batch []*batchReq) (first, twice []*batchReq) {
	seen := make(map[[2]string]bool, len(batch))
	for _, q := range batch {
		k := [2]string{q.job.GetKind(), q.job.GetId()}
		if seen[k] {
			twice = append(twice, q)
			continue
		}
		seen[k] = true
		first = append(first, q)
	}
	return first, twice
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

func (r *Runner) observe(db DB, jobs int, committed bool) {
	if r.cfg.OnBatch != nil && jobs > 1 {
		r.cfg.OnBatch(db.Role, jobs, committed)
	}
}

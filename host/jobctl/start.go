package jobctl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/usherhq/usher/host/outbox"
)

// startTimeout bounds one batch of starts: it runs for every caller in
// it, so no one caller's context cancels it.
const startTimeout = 10 * time.Second

// Start marks the delivery of outbox row outboxID (job jobID, a workflow
// step when step) started, before a host runs it, and reports whether it
// may run: false when the job, or the step, was cancelled before it
// started (usher_job_start). From here on a cancel leaves the run to
// finish. A host starts its deliveries through a Starter, which asks for
// many in one round trip.
func Start(ctx context.Context, q outbox.Querier, outboxID int64, jobID string, step bool) (bool, error) {
	run, err := startBatch(ctx, q, []*start{{outboxID: outboxID, jobID: jobID, step: step}})
	if err != nil {
		return false, err
	}
	return run[0], nil
}

// Starter asks for the starts of concurrent deliveries together: a Start
// that finds none in flight runs at once, alone; those that arrive while
// one runs wait for it and go in the next, one round trip for them all
// (usher_jobs_start). It starts no goroutine: the first caller of each
// batch runs it. Safe for concurrent use.
type Starter struct {
	db outbox.Querier

	mu    sync.Mutex
	queue []*start
	busy  bool
}

// NewStarter returns a Starter asking db (the host's pool).
func NewStarter(db outbox.Querier) *Starter { return &Starter{db: db} }

type start struct {
	outboxID int64
	jobID    string
	step     bool
	run      bool
	err      error
	// done is closed once run and err are set; lead is sent to when this
	// caller is to run the next batch.
	done chan struct{}
	lead chan struct{}
}

// Start is Start, batched with the concurrent ones.
func (s *Starter) Start(ctx context.Context, outboxID int64, jobID string, step bool) (bool, error) {
	st := &start{outboxID: outboxID, jobID: jobID, step: step, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, st)
	lead := !s.busy
	s.busy = true
	s.mu.Unlock()
	if !lead {
		select {
		case <-st.done:
			return st.run, st.err
		case <-st.lead:
		}
	}
	s.flush(ctx)
	<-st.done // it was in the batch just run
	return st.run, st.err
}

// flush runs the queued starts as one batch, then hands the next batch
// to its first caller (or marks the Starter idle).
func (s *Starter) flush(ctx context.Context) {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	run, err := startBatch(ctx, s.db, batch)
	cancel()
	for i, st := range batch {
		if err != nil {
			st.err = err
		} else {
			st.run = run[i]
		}
		close(st.done)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		s.busy = false
		return
	}
	s.queue[0].lead <- struct{}{}
}

func startBatch(ctx context.Context, q outbox.Querier, batch []*start) ([]bool, error) {
	ids := make([]int64, len(batch))
	jobs := make([]string, len(batch))
	steps := make([]bool, len(batch))
	for i, st := range batch {
		ids[i], jobs[i], steps[i] = st.outboxID, st.jobID, st.step
	}
	var run []bool
	if err := q.QueryRow(ctx, `SELECT usher_jobs_start($1, $2, $3)`, ids, jobs, steps).Scan(&run); err != nil {
		return nil, fmt.Errorf("start %d job(s): %w", len(batch), err)
	}
	if len(run) != len(batch) {
		return nil, errors.New("start: usher_jobs_start answered for another number of jobs")
	}
	return run, nil
}

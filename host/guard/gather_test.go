package guard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// A batch about to start waits for the jobs on their way to the runner
// (Config.Arriving) and, after a batch is over, for as many jobs as it
// had: the first job to arrive does not run alone while the others queue
// behind it. A count that never falls holds a batch for GatherWait at
// most.
func TestBatchGathersArrivingJobs(t *testing.T) {
	t.Parallel()
	owner, db := gcountDB(t, "")
	ctx := context.Background()

	newRunner := func(arriving *arrivals, wait time.Duration) (*guard.Runner, *[]int) {
		var mu sync.Mutex
		var sizes []int
		runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: 32,
			Arriving: arriving.get, Solo: pluginhost.IsAlone,
			GatherWait: wait,
			OnBatch: func(b guard.BatchReport) {
				mu.Lock()
				defer mu.Unlock()
				jobs := b.Jobs
				if !b.Committed {
					jobs = -jobs // a split batch: fails the comparisons below
				}
				sizes = append(sizes, jobs)
			}})
		require.NoError(t, err)
		return runner, &sizes
	}

	t.Run("waits for the jobs on their way", func(t *testing.T) {
		arriving := &arrivals{}
		arriving.set(3) // b, c and d: read, not yet queued
		runner, sizes := newRunner(arriving, time.Minute)
		inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{}}
		runs := newJobRuns(runner, inv, db)
		runs.start("a")
		time.Sleep(100 * time.Millisecond)
		for _, id := range []string{"b", "c", "d"} {
			runs.start(id)
		}
		time.Sleep(100 * time.Millisecond) // queued behind a
		inv.mu.Lock()
		require.Empty(t, inv.calls, "a batch started while jobs were still arriving")
		inv.mu.Unlock()
		woke := time.Now()
		arriving.set(0)
		outs := runs.wait()
		// GatherWait is a minute: the count falling woke the batch.
		require.Less(t, time.Since(woke), 30*time.Second, "the batch waited out GatherWait")
		for _, id := range []string{"a", "b", "c", "d"} {
			require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %+v", id, outs[id])
			require.Equal(t, 1, inv.calls[id], id)
		}
		require.Equal(t, []int{4}, *sizes, "one batch of the four")
		require.EqualValues(t, 4, hosttest.Count(t, owner, `SELECT n FROM gcount WHERE id = 0`))

		// A batch of four is over: the next job waits for as many to
		// join it (their slots came back together), none arriving yet.
		// (The batch is over a moment after its jobs are finished.)
		time.Sleep(100 * time.Millisecond)
		runs.start("e")
		time.Sleep(100 * time.Millisecond)
		inv.mu.Lock()
		require.Zero(t, inv.calls["e"], "e started before the jobs of the batch's slots came")
		inv.mu.Unlock()
		woke = time.Now()
		for _, id := range []string{"f", "g", "h"} {
			runs.start(id)
		}
		outs = runs.wait()
		require.Less(t, time.Since(woke), 30*time.Second, "the jobs queued did not wake the batch")
		for _, id := range []string{"e", "f", "g", "h"} {
			require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %+v", id, outs[id])
		}
		require.Equal(t, []int{4, 4}, *sizes, "a second batch of four")
	})

	t.Run("a job arrives when queued, or as it starts alone", func(t *testing.T) {
		runner, _ := newRunner(&arrivals{}, time.Minute)
		inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{}}
		for _, solo := range []bool{false, true} {
			id := fmt.Sprint("arrives-", solo)
			var arrived, calledBefore int
			d := guard.Delivery{Arrived: func() {
				inv.mu.Lock()
				defer inv.mu.Unlock()
				arrived++
				calledBefore = inv.calls[id]
			}}
			jobCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if solo {
				jobCtx = pluginhost.Alone(jobCtx)
			}
			out := runner.Run(jobCtx, inv, db, usherv1.Guard_GUARD_JOB_ID, &usherv1.Job{Id: id, Kind: "raw_job"}, d)
			cancel()
			require.Equal(t, guard.Applied, out.Verdict, "%+v", out)
			require.Equal(t, 1, arrived, "solo %v: Arrived calls", solo)
			require.Zero(t, calledBefore, "solo %v: Arrived came after the plugin's call began", solo)
		}
	})

	t.Run("a negative GatherWait does not wait", func(t *testing.T) {
		arriving := &arrivals{}
		arriving.set(5) // never queued
		runner, _ := newRunner(arriving, -1)
		inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{}}
		runs := newJobRuns(runner, inv, db)
		runs.start("unwaited")
		outs := runs.wait()
		require.Equal(t, guard.Applied, outs["unwaited"].Verdict, "%+v", outs["unwaited"])
		require.Zero(t, arriving.looked(), "the batch asked what was arriving: it meant to wait")
	})

	t.Run("waits no longer than GatherWait", func(t *testing.T) {
		arriving := &arrivals{}
		arriving.set(5) // never queued
		runner, _ := newRunner(arriving, 50*time.Millisecond)
		inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{}}
		runs := newJobRuns(runner, inv, db)
		start := time.Now()
		runs.start("lone")
		outs := runs.wait()
		require.Equal(t, guard.Applied, outs["lone"].Verdict, "%+v", outs["lone"])
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "it did not wait for the arriving jobs")
	})
}

// arrivals is a count of jobs arriving as stream.Consumer.Arriving keeps
// it: with a channel closed when it falls to 0.
type arrivals struct {
	mu    sync.Mutex
	n     int
	zero  chan struct{}
	calls int
}

func (a *arrivals) get() (int, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	if a.zero == nil {
		a.zero = make(chan struct{})
	}
	if a.n == 0 {
		close(a.zero)
		defer func() { a.zero = nil }()
	}
	return a.n, a.zero
}

func (a *arrivals) set(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n = n
	if n == 0 && a.zero != nil {
		close(a.zero)
		a.zero = nil
	}
}

// looked is how many times the runner asked.
func (a *arrivals) looked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

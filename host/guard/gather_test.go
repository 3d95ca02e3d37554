package guard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
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

	newRunner := func(arriving *atomic.Int64, wait time.Duration) (*guard.Runner, *[]int) {
		var mu sync.Mutex
		var sizes []int
		runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: 32,
			Arriving:   func() int { return int(arriving.Load()) },
			GatherWait: wait,
			OnBatch: func(_ string, jobs int, committed bool) {
				mu.Lock()
				defer mu.Unlock()
				if !committed {
					jobs = -jobs // a split batch: fails the comparisons below
				}
				sizes = append(sizes, jobs)
			}})
		require.NoError(t, err)
		return runner, &sizes
	}
	run := func(wg *sync.WaitGroup, runner *guard.Runner, inv guard.Invoker, id string, outs map[string]guard.Outcome, mu *sync.Mutex) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jobCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			out := runner.Run(jobCtx, inv, db, usherv1.Guard_GUARD_JOB_ID, &usherv1.Job{Id: id, Kind: "raw_job"}, guard.Delivery{})
			mu.Lock()
			outs[id] = out
			mu.Unlock()
		}()
	}

	t.Run("waits for the jobs on their way", func(t *testing.T) {
		var arriving atomic.Int64
		arriving.Store(3) // b, c and d: read, not yet dispatched
		runner, sizes := newRunner(&arriving, time.Minute)
		inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{}}
		outs, mu, wg := map[string]guard.Outcome{}, &sync.Mutex{}, &sync.WaitGroup{}
		run(wg, runner, inv, "a", outs, mu)
		time.Sleep(100 * time.Millisecond)
		for _, id := range []string{"b", "c", "d"} {
			run(wg, runner, inv, id, outs, mu)
		}
		time.Sleep(100 * time.Millisecond) // queued behind a
		inv.mu.Lock()
		require.Empty(t, inv.calls, "a batch started while jobs were still arriving")
		inv.mu.Unlock()
		arriving.Store(0)
		wg.Wait()
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
		run(wg, runner, inv, "e", outs, mu)
		time.Sleep(100 * time.Millisecond)
		inv.mu.Lock()
		require.Zero(t, inv.calls["e"], "e started before the jobs of the batch's slots came")
		inv.mu.Unlock()
		for _, id := range []string{"f", "g", "h"} {
			run(wg, runner, inv, id, outs, mu)
		}
		wg.Wait()
		for _, id := range []string{"e", "f", "g", "h"} {
			require.Equal(t, guard.Applied, outs[id].Verdict, "%s: %+v", id, outs[id])
		}
		require.Equal(t, []int{4, 4}, *sizes, "a second batch of four")
	})

	t.Run("waits no longer than GatherWait", func(t *testing.T) {
		var arriving atomic.Int64
		arriving.Store(5) // never dispatched
		runner, _ := newRunner(&arriving, 50*time.Millisecond)
		inv := &gatedInvoker{calls: map[string]int{}, wait: map[string]chan struct{}{}}
		outs, mu, wg := map[string]guard.Outcome{}, &sync.Mutex{}, &sync.WaitGroup{}
		start := time.Now()
		run(wg, runner, inv, "lone", outs, mu)
		wg.Wait()
		require.Equal(t, guard.Applied, outs["lone"].Verdict, "%+v", outs["lone"])
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "it did not wait for the arriving jobs")
	})
}

package sdk

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Calls that wait for each other all run at once (a call never waits for
// a worker), and the workers stay for the next calls.
func TestWorkersRunCallsAtOnceAndStay(t *testing.T) {
	w := workers{tasks: make(chan func())}
	const n = 100
	for range 3 {
		var all, done sync.WaitGroup
		all.Add(n)
		done.Add(n)
		for range n {
			w.run(func() {
				defer done.Done()
				all.Done()
				all.Wait() // every call is running
			})
		}
		finished := make(chan struct{})
		go func() { done.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Fatal("calls waiting on each other did not all run")
		}
		time.Sleep(100 * time.Millisecond) // the workers go back to waiting
	}
	// Three rounds of 100 at once on 100 workers, not 300 goroutines.
	require.LessOrEqual(t, w.live.Load(), int32(n))
}

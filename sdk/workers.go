package sdk

import "sync/atomic"

// calls runs a batch's calls on goroutines kept from one Invoke to the
// next. A goroutine of its own per call started every job on a fresh
// 8 KiB stack, which the job's first deep call (encoding/json decoding
// its arguments) had to grow and copy: about 12 % of the counters
// plugin's CPU at 64 jobs in flight (bin/bench, a CPU profile of the
// plugin). A call never waits for a worker: with none idle it gets a new
// goroutine, which then stays for later calls; so calls of one batch that
// wait on each other cannot deadlock here. At most maxWorkers stay.
var calls = workers{tasks: make(chan func())}

// maxWorkers bounds the goroutines kept between calls (each holds a
// stack, which the garbage collector shrinks while it is idle).
const maxWorkers = 256

type workers struct {
	// tasks is unbuffered: a send succeeds only when a worker is idle.
	tasks chan func()
	// live counts the workers, busy or idle.
	live atomic.Int32
}

// run runs f on an idle worker, or on a new one when none is idle.
func (w *workers) run(f func()) {
	select {
	case w.tasks <- f:
	default:
		w.live.Add(1)
		go w.work(f)
	}
}

func (w *workers) work(f func()) {
	for {
		f()
		if w.live.Load() > maxWorkers {
			w.live.Add(-1)
			return
		}
		f = <-w.tasks
	}
}

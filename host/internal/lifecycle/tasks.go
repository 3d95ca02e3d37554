package lifecycle

import (
	"sync"
	"sync/atomic"
)

// Tasks tracks the goroutines a service starts outside its Run loop (a
// background rollback, a redispatch wait). The service owns it and calls
// Wait before its Run returns, so every goroutine has someone waiting for
// it. The zero value is ready to use; a Tasks must not be copied.
type Tasks struct {
	wg      sync.WaitGroup
	running atomic.Int64
}

// Go runs fn in a new goroutine tracked by t. A panic in fn is not
// recovered: it crashes the process like any goroutine's.
func (t *Tasks) Go(fn func()) {
	t.running.Add(1)
	t.wg.Go(func() {
		defer t.running.Add(-1)
		fn()
	})
}

// Wait blocks until every goroutine started by Go has returned.
func (t *Tasks) Wait() { t.wg.Wait() }

// Running reports how many goroutines started by Go have not returned yet.
func (t *Tasks) Running() int { return int(t.running.Load()) }

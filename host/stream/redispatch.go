package stream

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/usherhq/usher/host/internal/lifecycle"
)

// RedispatcherConfig configures a Redispatcher.
type RedispatcherConfig struct {
	// Pending is the consumer's pending entries. Required.
	Pending Pending
	// Take is Consumer.Take of the consumer that left the entries. Required.
	Take func(ctx context.Context, max int, read func(ctx context.Context, n int) ([]Entry, error)) (int, error)
	// Ready reports whether an entry of kind may run now (its plugin is
	// running and below its share of stalled jobs). Required.
	Ready func(kind string) bool
	// GiveUpAfter is how long an entry is waited for before it is left to
	// the reclaimer. Default 60s (the reclaim threshold).
	GiveUpAfter time.Duration
	// MaxWaiting bounds the entries waited for at once; each waits as its
	// stream id alone (the entry is read again when it runs). Default 4096.
	MaxWaiting int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Redispatcher runs again, on this host, entries it left pending because
// their plugin crashed under them, was not running, or had its share of
// stalled jobs: as soon as Ready says so, not after the reclaim threshold.
// The reclaimer remains for the entries of hosts that died. An entry it
// stops waiting for (GiveUpAfter passed, or Run's context ended) stays
// pending for the reclaimer. Every goroutine it starts ends before Run
// returns.
type Redispatcher struct {
	cfg     RedispatcherConfig
	mu      sync.Mutex
	ctx     context.Context
	tasks   lifecycle.Tasks
	waiting sync.Map
	n       atomic.Int64
}

// NewRedispatcher validates cfg and fills its defaults.
func NewRedispatcher(cfg RedispatcherConfig) (*Redispatcher, error) {
	if cfg.Pending.Redis == nil || cfg.Take == nil || cfg.Ready == nil {
		return nil, errors.New("stream: redispatcher needs Pending, Take and Ready")
	}
	if cfg.GiveUpAfter <= 0 {
		cfg.GiveUpAfter = 60 * time.Second
	}
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Redispatcher{cfg: cfg}, nil
}

// Run accepts entries (Later) until ctx is done, then waits for the
// goroutines waiting on them to end.
func (r *Redispatcher) Run(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.ctx = nil
	r.mu.Unlock()
	r.tasks.Wait()
	return nil
}

// Waiting is how many entries are waited for now.
func (r *Redispatcher) Waiting() int64 { return r.n.Load() }

// Later runs e again once Ready(e.Kind), unless it is waited for already,
// MaxWaiting are, or Run is not running. It never blocks.
func (r *Redispatcher) Later(e Entry) {
	r.mu.Lock()
	ctx := r.ctx
	if ctx == nil || ctx.Err() != nil || r.n.Load() >= int64(r.cfg.MaxWaiting) {
		r.mu.Unlock()
		return
	}
	id, shard, key, kind := e.StreamID, e.Stream, e.Key(), e.Kind
	if _, dup := r.waiting.LoadOrStore(key, true); dup {
		r.mu.Unlock()
		return
	}
	r.n.Add(1)
	// Started under mu: Run waits for the tasks after clearing ctx.
	r.tasks.Go(func() {
		defer r.n.Add(-1)
		if !r.wait(ctx, kind) {
			r.waiting.Delete(key)
			return
		}
		e, ok, err := r.cfg.Pending.ClaimOwn(ctx, shard, id)
		// Forgotten before it runs: a run held back again (a kind at its
		// limit) asks Later for it while this task is still in Take.
		r.waiting.Delete(key)
		if err != nil || !ok {
			return
		}
		r.cfg.Logger.Debug("entry run again now that its plugin is ready", "stream_id", id, "job_id", e.JobID, "deliveries", e.Deliveries)
		_, _ = r.cfg.Take(ctx, 1, func(context.Context, int) ([]Entry, error) { return []Entry{e}, nil })
	})
	r.mu.Unlock()
}

// wait polls Ready(kind) with a growing pause until it holds (true), or
// GiveUpAfter passes or ctx ends (false). The first pause lets the run
// that left the entry end before it runs again here (the consumer refuses
// an entry still running).
func (r *Redispatcher) wait(ctx context.Context, kind string) bool {
	deadline := time.Now().Add(r.cfg.GiveUpAfter)
	pause := 100 * time.Millisecond
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if r.cfg.Ready(kind) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		pause = min(2*pause, time.Second)
		t.Reset(pause)
	}
}

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
)

// Service is a unit the Group runs. Run blocks until ctx is done or the
// service fails, and returns nil on a clean stop. Returning ctx.Err() (or
// context.Cause(ctx)) after the Group stopped the service also counts as a
// clean stop. A Service is run once.
type Service interface {
	Name() string
	Run(ctx context.Context) error
}

// Starter is a Service that reports when it is started. The Group starts
// the next phase only after Started is closed (or Run returned) for every
// Starter in the phase; a Service that is not a Starter counts as started as
// soon as its goroutine is launched. Started is called before Run.
type Starter interface {
	Service
	Started() <-chan struct{}
}

// ErrStopped is the cause of the ctx cancellation a Group uses to stop a
// service (see context.Cause).
var ErrStopped = errors.New("lifecycle: stopped")

// ErrExited is the failure of a MustRun service whose Run returned nil
// before its ctx was done.
var ErrExited = errors.New("exited before being stopped")

// PanicError is the failure of a service whose Run panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Func adapts a plain loop to a Service that is started as soon as it runs.
func Func(name string, run func(ctx context.Context) error) Service {
	return &funcService{name: name, run: run}
}

// FuncReady adapts a loop that calls ready once it is started (ready may be
// called more than once; only the first call counts) to a Starter.
func FuncReady(name string, run func(ctx context.Context, ready func()) error) Starter {
	started := make(chan struct{})
	return &readyService{
		funcService: funcService{name: name},
		started:     started,
		ready:       sync.OnceFunc(func() { close(started) }),
		run:         run,
	}
}

type funcService struct {
	name string
	run  func(ctx context.Context) error
}

func (s *funcService) Name() string                  { return s.name }
func (s *funcService) Run(ctx context.Context) error { return s.run(ctx) }

type readyService struct {
	funcService
	started chan struct{}
	ready   func()
	run     func(ctx context.Context, ready func()) error
}

func (s *readyService) Started() <-chan struct{}      { return s.started }
func (s *readyService) Run(ctx context.Context) error { return s.run(ctx, s.ready) }

// MustRun wraps s so that its Run returning nil before its ctx is done is a
// failure (ErrExited) that stops the Group. Without it, such a service is
// "finished": the Group keeps running the others.
func MustRun(s Service) Starter { return mustRun{s} }

type mustRun struct{ Service }

func (m mustRun) Started() <-chan struct{} {
	if st, ok := m.Service.(Starter); ok {
		return st.Started()
	}
	c := make(chan struct{})
	close(c)
	return c
}

func (m mustRun) Run(ctx context.Context) error {
	err := m.Service.Run(ctx)
	if err == nil && ctx.Err() == nil {
		return ErrExited
	}
	return err
}

// Phase is a named set of services started concurrently, in order.
type Phase struct {
	Name     string
	Services []Service
}

// Group runs services in phases. See Run.
type Group struct {
	phases []Phase
}

// NewGroup returns a Group that runs phases in the order given.
func NewGroup(phases ...Phase) *Group { return &Group{phases: phases} }

type result struct {
	phase, idx int
	err        error
}

type phaseState struct {
	cancel   context.CancelCauseFunc
	left     int // service goroutines not yet returned
	stopping bool
}

// Run starts the phases in order, launching a phase's services concurrently
// in their listed order and waiting until each is started before the next
// phase. It then runs until ctx is done, a service fails, or every service
// has finished (returned nil on its own, which is not a failure unless the
// service is MustRun). Then it stops the started phases in reverse order,
// cancelling one phase and waiting for all its goroutines to end before
// cancelling the previous one. A failure while starting stops the phases
// already started; later phases never start.
//
// Run returns after every goroutine it started ended: nil on a clean stop,
// or errors.Join of each failure as "service NAME: err". ctx's values reach
// the services but its cancellation only triggers the ordered stop. Run may
// be called once.
func (g *Group) Run(ctx context.Context) error {
	base := context.WithoutCancel(ctx)
	total := 0
	for _, p := range g.phases {
		total += len(p.Services)
	}
	results := make(chan result, total)
	var wg sync.WaitGroup
	defer wg.Wait()

	var (
		states []*phaseState
		errs   []error
		left   = 0
	)
	record := func(r result) {
		st := states[r.phase]
		st.left--
		left--
		err := r.err
		if st.stopping && (errors.Is(err, context.Canceled) || errors.Is(err, ErrStopped)) {
			err = nil
		}
		if err != nil {
			name := g.phases[r.phase].Services[r.idx].Name()
			errs = append(errs, fmt.Errorf("service %s: %w", name, err))
		}
	}

starting:
	for i, p := range g.phases {
		pctx, cancel := context.WithCancelCause(base)
		states = append(states, &phaseState{cancel: cancel, left: len(p.Services)})
		left += len(p.Services)
		ready := launch(pctx, i, p.Services, results, &wg)
		for waiting := true; waiting; {
			select {
			case <-ready:
				waiting = false
				// A service that failed while starting counts as
				// started: its result is waiting, and it stops the
				// start before the next phase.
				for drained := false; !drained; {
					select {
					case r := <-results:
						record(r)
					default:
						drained = true
					}
				}
				if len(errs) > 0 {
					break starting
				}
			case r := <-results:
				record(r)
				if len(errs) > 0 {
					break starting
				}
			case <-ctx.Done():
				break starting
			}
		}
	}

	for len(errs) == 0 && left > 0 && ctx.Err() == nil {
		select {
		case r := <-results:
			record(r)
		case <-ctx.Done():
		}
	}

	for i := len(states) - 1; i >= 0; i-- {
		st := states[i]
		st.stopping = true
		st.cancel(ErrStopped)
		for st.left > 0 {
			record(<-results)
		}
	}
	return errors.Join(errs...)
}

// launch starts one goroutine per service and returns a channel closed once
// every service is started or has returned.
func launch(ctx context.Context, phase int, svcs []Service, results chan<- result, wg *sync.WaitGroup) <-chan struct{} {
	var waits [][2]<-chan struct{}
	for j, s := range svcs {
		exited := make(chan struct{})
		if st, ok := s.(Starter); ok {
			waits = append(waits, [2]<-chan struct{}{st.Started(), exited})
		}
		wg.Go(func() {
			err := runSafe(ctx, s)
			// The result first: a service that returned (and so counts
			// as started) has its result waiting before its phase is
			// ready (results holds every service's).
			results <- result{phase, j, err}
			close(exited)
		})
	}
	ready := make(chan struct{})
	wg.Go(func() {
		defer close(ready)
		for _, w := range waits {
			select {
			case <-w[0]:
			case <-w[1]:
			}
		}
	})
	return ready
}

func runSafe(ctx context.Context, s Service) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return s.Run(ctx)
}

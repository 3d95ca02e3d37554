package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/usherhq/usher/host/internal/lifecycle"
)

// TestMain checks no test leaves a goroutine behind; per-test VerifyNone
// would see the goroutines of the other parallel tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder logs events and counts the services still inside Run.
type recorder struct {
	mu      sync.Mutex
	events  []string
	running atomic.Int64
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// blocker is a Starter that is ready at once, reports it on up, and runs
// until stopped.
func (r *recorder) blocker(phase, name string, up chan<- string) lifecycle.Service {
	return lifecycle.FuncReady(name, func(ctx context.Context, ready func()) error {
		r.running.Add(1)
		defer r.running.Add(-1)
		r.add("start %s %s", phase, name)
		ready()
		if up != nil {
			up <- name
		}
		<-ctx.Done()
		r.add("stop %s %s", phase, name)
		return ctx.Err()
	})
}

// phaseOrder returns the phase of each event of kind, in log order, with
// repeats collapsed.
func phaseOrder(log []string, kind string) []string {
	var out []string
	for _, e := range log {
		f := strings.Fields(e)
		if f[0] == kind && (len(out) == 0 || out[len(out)-1] != f[1]) {
			out = append(out, f[1])
		}
	}
	return out
}

func TestPhasesStartInOrderStopInReverse(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	up := make(chan string, 6)
	names := []string{"stream", "plugins", "admin"}
	var phases []lifecycle.Phase
	for _, p := range names {
		phases = append(phases, lifecycle.Phase{Name: p, Services: []lifecycle.Service{
			r.blocker(p, p+"-a", up), r.blocker(p, p+"-b", up),
		}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lifecycle.NewGroup(phases...).Run(ctx) }()
	for range 6 {
		<-up
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := r.running.Load(); n != 0 {
		t.Fatalf("%d services still running after Run returned", n)
	}
	log := r.log()
	if got := phaseOrder(log, "start"); !slices.Equal(got, names) {
		t.Errorf("start order %v, want %v (log %q)", got, names, log)
	}
	if got, want := phaseOrder(log, "stop"), []string{"admin", "plugins", "stream"}; !slices.Equal(got, want) {
		t.Errorf("stop order %v, want %v (log %q)", got, want, log)
	}
	if i := slices.IndexFunc(log, func(e string) bool { return strings.HasPrefix(e, "stop") }); i != 6 {
		t.Errorf("first stop at %d, want after all 6 starts (log %q)", i, log)
	}
}

func TestNextPhaseWaitsForReady(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var firstReady atomic.Bool
	slow := lifecycle.FuncReady("slow", func(ctx context.Context, ready func()) error {
		<-release
		firstReady.Store(true)
		ready()
		<-ctx.Done()
		return nil
	})
	secondRan := make(chan bool, 1)
	second := lifecycle.Func("second", func(ctx context.Context) error {
		secondRan <- firstReady.Load()
		<-ctx.Done()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lifecycle.NewGroup(
			lifecycle.Phase{Name: "one", Services: []lifecycle.Service{slow}},
			lifecycle.Phase{Name: "two", Services: []lifecycle.Service{second}},
		).Run(ctx)
	}()
	close(release)
	if !<-secondRan {
		t.Error("phase two ran before phase one was ready")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestFailAtStartStopsOthers(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	up := make(chan string, 3)
	boom := errors.New("boom")
	// broken waits until its phase sibling is up, so the test sees a started
	// service in the failing phase stopped too.
	broken := lifecycle.FuncReady("broken", func(ctx context.Context, ready func()) error {
		<-up
		return boom
	})
	never := lifecycle.Func("never", func(ctx context.Context) error {
		t.Error("a phase after the failure started")
		return nil
	})
	first := make(chan string, 1)
	err := lifecycle.NewGroup(
		lifecycle.Phase{Name: "stream", Services: []lifecycle.Service{r.blocker("stream", "s", first)}},
		lifecycle.Phase{Name: "plugins", Services: []lifecycle.Service{r.blocker("plugins", "p", up), broken}},
		lifecycle.Phase{Name: "admin", Services: []lifecycle.Service{never}},
	).Run(context.Background())
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "service broken: boom") {
		t.Fatalf("Run = %v, want it to wrap boom as service broken", err)
	}
	if n := r.running.Load(); n != 0 {
		t.Fatalf("%d services still running after Run returned", n)
	}
	if got, want := phaseOrder(r.log(), "stop"), []string{"plugins", "stream"}; !slices.Equal(got, want) {
		t.Errorf("stop order %v, want %v", got, want)
	}
}

func TestPanicBecomesErrorNamingService(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	up := make(chan string, 1)
	panicker := lifecycle.Func("panicker", func(ctx context.Context) error {
		<-up
		panic("kaboom")
	})
	err := lifecycle.NewGroup(
		lifecycle.Phase{Name: "stream", Services: []lifecycle.Service{r.blocker("stream", "s", up)}},
		lifecycle.Phase{Name: "background", Services: []lifecycle.Service{panicker}},
	).Run(context.Background())
	var pe *lifecycle.PanicError
	if !errors.As(err, &pe) || pe.Value != "kaboom" || len(pe.Stack) == 0 {
		t.Fatalf("Run = %v, want a PanicError with kaboom and a stack", err)
	}
	if got, want := err.Error(), "service panicker: panic: kaboom"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	if n := r.running.Load(); n != 0 {
		t.Fatalf("%d services still running after Run returned", n)
	}
}

func TestCancelStopsCleanly(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	up := make(chan string, 3)
	cause := lifecycle.Func("cause", func(ctx context.Context) error {
		up <- "cause"
		<-ctx.Done()
		return context.Cause(ctx)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lifecycle.NewGroup(
			lifecycle.Phase{Name: "stream", Services: []lifecycle.Service{r.blocker("stream", "a", up), cause}},
			lifecycle.Phase{Name: "admin", Services: []lifecycle.Service{r.blocker("admin", "b", up)}},
		).Run(ctx)
	}()
	for range 3 {
		<-up
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := r.running.Load(); n != 0 {
		t.Fatalf("%d services still running after Run returned", n)
	}
}

func TestCancelWhileStarting(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	stuck := lifecycle.FuncReady("stuck", func(ctx context.Context, ready func()) error {
		cancel() // never ready; the caller gives up
		<-ctx.Done()
		return nil
	})
	never := lifecycle.Func("never", func(ctx context.Context) error {
		t.Error("a phase after a cancelled start started")
		return nil
	})
	err := lifecycle.NewGroup(
		lifecycle.Phase{Name: "one", Services: []lifecycle.Service{stuck}},
		lifecycle.Phase{Name: "two", Services: []lifecycle.Service{never}},
	).Run(ctx)
	if err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestFinishedIsNotFailureUnlessMustRun(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	up := make(chan string, 1)
	finished := make(chan struct{})
	oneShot := lifecycle.Func("oneshot", func(ctx context.Context) error {
		defer close(finished)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lifecycle.NewGroup(lifecycle.Phase{Name: "p", Services: []lifecycle.Service{
			oneShot, r.blocker("p", "b", up),
		}}).Run(ctx)
	}()
	<-up
	<-finished
	select {
	case err := <-done:
		t.Fatalf("Run returned %v after a service finished, others still running", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}

	// The same service as MustRun fails the group.
	up = make(chan string, 1)
	err := lifecycle.NewGroup(lifecycle.Phase{Name: "p", Services: []lifecycle.Service{
		r.blocker("p", "b", up),
		lifecycle.MustRun(lifecycle.Func("oneshot", func(ctx context.Context) error { <-up; return nil })),
	}}).Run(context.Background())
	if !errors.Is(err, lifecycle.ErrExited) || !strings.Contains(err.Error(), "service oneshot:") {
		t.Fatalf("Run = %v, want ErrExited naming oneshot", err)
	}
	if n := r.running.Load(); n != 0 {
		t.Fatalf("%d services still running after Run returned", n)
	}
}

func TestAllFinishedReturnsNil(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	f := func(ctx context.Context) error { ran.Add(1); return nil }
	err := lifecycle.NewGroup(
		lifecycle.Phase{Name: "a", Services: []lifecycle.Service{lifecycle.Func("f1", f), lifecycle.Func("f2", f)}},
		lifecycle.Phase{Name: "b", Services: []lifecycle.Service{lifecycle.Func("f3", f)}},
	).Run(context.Background())
	if err != nil || ran.Load() != 3 {
		t.Fatalf("Run = %v after %d runs, want nil after 3", err, ran.Load())
	}
}

func TestFailuresAreJoined(t *testing.T) {
	t.Parallel()
	errA, errB := errors.New("a failed"), errors.New("b failed on stop")
	a := lifecycle.Func("a", func(ctx context.Context) error { return errA })
	b := lifecycle.Func("b", func(ctx context.Context) error { <-ctx.Done(); return errB })
	err := lifecycle.NewGroup(
		lifecycle.Phase{Name: "one", Services: []lifecycle.Service{b}},
		lifecycle.Phase{Name: "two", Services: []lifecycle.Service{a}},
	).Run(context.Background())
	if !errors.Is(err, errA) || !errors.Is(err, errB) {
		t.Fatalf("Run = %v, want both failures", err)
	}
	if got, want := err.Error(), "service a: a failed\nservice b: b failed on stop"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
}

func TestTasksWaitsForGoroutines(t *testing.T) {
	t.Parallel()
	var tasks lifecycle.Tasks
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	var finished atomic.Int64
	for range 3 {
		tasks.Go(func() {
			started <- struct{}{}
			<-release
			finished.Add(1)
		})
	}
	for range 3 {
		<-started
	}
	if n := tasks.Running(); n != 3 {
		t.Fatalf("Running = %d, want 3", n)
	}
	waited := make(chan struct{})
	go func() { tasks.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned while tasks were blocked")
	default:
	}
	close(release)
	<-waited
	if finished.Load() != 3 || tasks.Running() != 0 {
		t.Fatalf("after Wait: finished %d, running %d; want 3, 0", finished.Load(), tasks.Running())
	}
}

func TestServiceWaitsForItsTasks(t *testing.T) {
	t.Parallel()
	var tasks lifecycle.Tasks
	var rolledBack atomic.Bool
	svc := lifecycle.Func("dispatcher", func(ctx context.Context) error {
		defer tasks.Wait()
		tasks.Go(func() {
			<-ctx.Done()
			rolledBack.Store(true)
		})
		<-ctx.Done()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lifecycle.NewGroup(lifecycle.Phase{Name: "p", Services: []lifecycle.Service{svc}}).Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if !rolledBack.Load() || tasks.Running() != 0 {
		t.Fatal("Run returned before the service's task ended")
	}
}

package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// ErrUnavailable is returned by Invoke while the plugin is not running
// (crashed and restarting, or marked unhealthy).
var ErrUnavailable = errors.New("pluginhost: plugin is not running")

// SupervisorConfig configures a Supervisor.
type SupervisorConfig struct {
	// Plugin is how to start the plugin. Required.
	Plugin Config
	// CheckInterval is how often the process is checked. Default 200ms.
	CheckInterval time.Duration
	// MinBackoff and MaxBackoff bound the delay between restarts, doubled
	// after each crash. Defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// CrashLoop: this many crashes within CrashWindow marks the plugin
	// unhealthy (its kinds stop being served until a reload). Defaults 5
	// and 1 minute.
	CrashLoop   int
	CrashWindow time.Duration
	// HangLimit: this many calls in a row that run out of time, with none
	// answered in between, mean the process is wedged; it is killed and
	// restarted like a crashed one. Default 3.
	HangLimit int
	// DrainTimeout bounds how long a swap waits for the old version's
	// in-flight calls. Default 30s.
	DrainTimeout time.Duration
	// OnRestart, when set, is told of every restart.
	OnRestart func(m Manifest, pid int)
}

func (c *SupervisorConfig) setDefaults() {
	if c.CheckInterval <= 0 {
		c.CheckInterval = 200 * time.Millisecond
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 10 * time.Second
	}
	if c.CrashLoop <= 0 {
		c.CrashLoop = 5
	}
	if c.CrashWindow <= 0 {
		c.CrashWindow = time.Minute
	}
	if c.HangLimit <= 0 {
		c.HangLimit = 3
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.Plugin.Logger == nil {
		c.Plugin.Logger = slog.Default()
	}
}

// tracked is an instance with a count of calls in flight on it.
type tracked struct {
	*Instance
	// started is when the process came up: a crash after it ran stably
	// restarts from the shortest backoff again.
	started time.Time
	// timeouts counts calls in a row that ran out of time with no call
	// answered in between: a process that stops answering is killed (and
	// so restarted) after HangLimit of them.
	timeouts atomic.Int64
	inflight sync.WaitGroup
	calls    atomic.Int64
}

// Supervisor keeps one plugin running: it restarts a crashed process with
// backoff (its in-flight entries stay pending and are reclaimed), marks a
// crash-looping plugin unhealthy, and swaps versions without dropping calls.
type Supervisor struct {
	cfg SupervisorConfig

	// swapMu serialises swaps.
	swapMu sync.Mutex

	mu  sync.Mutex
	cur *tracked
	// gen counts the instances cur has held; a restart that finishes
	// after a swap replaced cur (gen moved on) is thrown away.
	gen       int
	healthy   bool
	crashes   []time.Time
	restarts  int
	nextStart time.Time
	backoff   time.Duration
	stopped   bool
	role      string
}

// NewSupervisor starts the plugin once; an error means it never ran.
func NewSupervisor(ctx context.Context, cfg SupervisorConfig) (*Supervisor, error) {
	cfg.setDefaults()
	inst, err := Start(ctx, cfg.Plugin)
	if err != nil {
		return nil, err
	}
	return &Supervisor{cfg: cfg, cur: &tracked{Instance: inst, started: time.Now()}, healthy: true, backoff: cfg.MinBackoff}, nil
}

// Manifest returns the running version's manifest.
func (s *Supervisor) Manifest() Manifest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Manifest()
}

// Pid returns the running process's pid.
func (s *Supervisor) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Pid()
}

// Healthy reports whether the plugin is not crash-looping.
func (s *Supervisor) Healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthy
}

// DBRole is the Postgres login role the plugin's statements run as.
func (s *Supervisor) DBRole() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.role
}

// SetDBRole sets the role DBRole reports. The host sets it before it
// routes any job to the plugin, and again after a swap.
func (s *Supervisor) SetDBRole(role string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.role = role
}

// Ready reports whether a call now would reach a running plugin: it is
// healthy, not stopped, and its process has not exited (a crashed plugin
// is not ready until its restart).
func (s *Supervisor) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthy && !s.stopped && !s.cur.Exited()
}

// Restarts counts restarts after crashes.
func (s *Supervisor) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Invoke sends calls to the current version.
func (s *Supervisor) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	s.mu.Lock()
	t := s.cur
	ok := s.healthy && !s.stopped && !t.Exited()
	if ok {
		t.inflight.Add(1)
	}
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, t.Manifest().Name)
	}
	defer t.inflight.Done()
	t.calls.Add(1)
	res, err := t.Invoke(ctx, calls)
	switch {
	case err == nil:
		t.timeouts.Store(0)
	case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		if n := t.timeouts.Add(1); n >= int64(s.cfg.HangLimit) {
			s.cfg.Plugin.Logger.Error("plugin stopped answering; killing it so it is restarted",
				"plugin", t.Manifest().Name, "pid", t.Pid(), "timeouts_in_a_row", n)
			t.Kill()
		}
	}
	return res, err
}

// Run watches the process until ctx is done, then stops it.
func (s *Supervisor) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.Stop()
			return
		case <-tick.C:
			s.check(ctx)
		}
	}
}

func (s *Supervisor) check(ctx context.Context) {
	s.mu.Lock()
	if s.stopped || !s.healthy || !s.cur.Exited() {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	if s.nextStart.IsZero() {
		// First sight of the crash: record it, schedule the restart.
		s.crashes = append(s.crashes, now)
		recent := s.crashes[:0]
		for _, t := range s.crashes {
			if now.Sub(t) <= s.cfg.CrashWindow {
				recent = append(recent, t)
			}
		}
		s.crashes = recent
		name, log := s.cur.Manifest().Name, s.cfg.Plugin.Logger
		if len(recent) >= s.cfg.CrashLoop {
			s.healthy = false
			s.mu.Unlock()
			log.Error("plugin is crash-looping; marked unhealthy, its kinds wait in the stream until it is reloaded",
				"plugin", name, "crashes", len(recent), "window", s.cfg.CrashWindow)
			return
		}
		if now.Sub(s.cur.started) >= s.cfg.CrashWindow {
			// It ran stably: this crash is not part of a loop.
			s.backoff = s.cfg.MinBackoff
		}
		s.nextStart = now.Add(s.backoff)
		s.cfg.Plugin.Logger.Warn("plugin exited; restarting", "plugin", name, "in", s.backoff)
		s.backoff = min(s.backoff*2, s.cfg.MaxBackoff)
		s.mu.Unlock()
		return
	}
	if now.Before(s.nextStart) {
		s.mu.Unlock()
		return
	}
	gen, pcfg := s.gen, s.cfg.Plugin
	s.mu.Unlock()

	inst, err := Start(ctx, pcfg)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen || s.stopped {
		// A swap (or Stop) replaced the crashed instance while this one
		// started: the swapped-in version wins.
		if inst != nil {
			inst.Kill()
		}
		return
	}
	if err != nil {
		s.nextStart = time.Now().Add(s.backoff)
		s.cfg.Plugin.Logger.Error("plugin restart failed", "path", s.cfg.Plugin.Path, "err", err, "next_in", s.backoff)
		s.backoff = min(s.backoff*2, s.cfg.MaxBackoff)
		return
	}
	s.cur = &tracked{Instance: inst, started: time.Now()}
	s.gen++
	s.nextStart = time.Time{}
	s.restarts++
	s.cfg.Plugin.Logger.Info("plugin restarted", "plugin", inst.Manifest().Name, "version", inst.Manifest().Version, "pid", inst.Pid())
	if s.cfg.OnRestart != nil {
		s.cfg.OnRestart(inst.Manifest(), inst.Pid())
	}
}

// SwapResult reports a completed swap.
type SwapResult struct {
	From, To Manifest
	// StartTime is how long the new version took to start and pass its
	// checks (handshake, health, manifest); new calls went to it from then
	// on.
	StartTime time.Duration
	// Drained is false when the old version's in-flight calls overran
	// DrainTimeout; those jobs are left unacked and are reclaimed.
	Drained   bool
	DrainTime time.Duration
}

// ErrStopped is returned by Swap on a stopped supervisor.
var ErrStopped = errors.New("pluginhost: supervisor is stopped")

// Swap starts cfg's binary, checks it answers its health check and serves
// the same kinds with the same guards, routes new calls to it, waits for
// the old version's in-flight calls up to DrainTimeout, and stops the old
// version. The swapped-in version starts healthy, with no crash history.
//
// If the new version fails to start (it exits, fails its checksum, speaks
// another protocol, reports another name or version than cfg asks for) or
// its kinds differ, the old one keeps serving unchanged and the error says
// why. admit, when set, is asked about the new version's manifest before
// any call is routed to it; its error refuses the swap the same way. Calls
// already running on the old version finish there; a job whose phases are
// separate calls may run its later phases on the new version.
func (s *Supervisor) Swap(ctx context.Context, cfg Config, admit func(Manifest) error) (SwapResult, error) {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	if cfg.Logger == nil {
		cfg.Logger = s.cfg.Plugin.Logger
	}
	begin := time.Now()
	inst, err := Start(ctx, cfg)
	if err != nil {
		return SwapResult{}, fmt.Errorf("swap refused, old version keeps serving: %w", err)
	}
	if admit != nil {
		if err := admit(inst.Manifest()); err != nil {
			inst.Kill()
			return SwapResult{}, fmt.Errorf("swap refused, old version keeps serving: %w", err)
		}
	}
	s.mu.Lock()
	old := s.cur
	if s.stopped {
		s.mu.Unlock()
		inst.Kill()
		return SwapResult{}, ErrStopped
	}
	if err := sameKinds(old.Manifest(), inst.Manifest()); err != nil {
		s.mu.Unlock()
		inst.Kill()
		return SwapResult{}, fmt.Errorf("swap refused, old version keeps serving: %w", err)
	}
	s.cur = &tracked{Instance: inst, started: time.Now()}
	s.gen++
	s.cfg.Plugin = cfg
	s.healthy, s.crashes, s.nextStart, s.backoff = true, nil, time.Time{}, s.cfg.MinBackoff
	s.mu.Unlock()

	start := time.Now()
	done := make(chan struct{})
	go func() {
		old.inflight.Wait()
		close(done)
	}()
	res := SwapResult{From: old.Manifest(), To: inst.Manifest(), StartTime: start.Sub(begin), Drained: true}
	select {
	case <-done:
	case <-time.After(s.cfg.DrainTimeout):
		res.Drained = false
	}
	res.DrainTime = time.Since(start)
	old.Kill()
	return res, nil
}

func sameKinds(a, b Manifest) error {
	if a.Name != b.Name {
		return fmt.Errorf("new binary is plugin %q, not %q", b.Name, a.Name)
	}
	want := map[string]usherv1.Guard{}
	for _, k := range a.Kinds {
		want[k.Kind] = k.Guard
	}
	for _, k := range b.Kinds {
		g, ok := want[k.Kind]
		switch {
		case !ok:
			return fmt.Errorf("new version %s adds kind %q; load it as a new plugin instead", b.Version, k.Kind)
		case g != k.Guard:
			return fmt.Errorf("new version %s changes the guard of %q from %v to %v", b.Version, k.Kind, g, k.Guard)
		}
		delete(want, k.Kind)
	}
	for k := range want {
		return fmt.Errorf("new version %s drops kind %q", b.Version, k)
	}
	return nil
}

// Stop kills the running process; Invoke fails from then on.
func (s *Supervisor) Stop() {
	s.mu.Lock()
	s.stopped = true
	cur := s.cur
	s.mu.Unlock()
	cur.Kill()
}

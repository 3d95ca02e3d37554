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

// maxQuarantine bounds how long a relapsing plugin stays unhealthy before
// its next retry.
const maxQuarantine = 10 * time.Minute

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
	// unhealthy: its kinds stop being served, and it is quarantined: it is
	// restarted UnhealthyRetry later (healthy again unless it crashes once
	// more within CrashWindow, which quarantines it for twice as long, up
	// to 10 minutes), or at once by a reload. A crash loop caused
	// by one poison entry so ends once the host has dead-lettered the
	// entry, with no operator. Defaults 5, 1 minute and 30s.
	CrashLoop      int
	CrashWindow    time.Duration
	UnhealthyRetry time.Duration
	// HangLimit: this many calls in a row that run out of time, with none
	// answered in between, mean the process is wedged; it is killed and
	// restarted like a crashed one. Default 3.
	HangLimit int
	// DrainTimeout bounds how long a swap waits for the old version's
	// in-flight calls. Default 30s.
	DrainTimeout time.Duration
	// OnRestart, when set, is told of every restart.
	OnRestart func(m Manifest, pid int)
	// OnUnhealthy, when set, is told when the running version is marked
	// unhealthy (a crash loop), with no lock held: the host rolls back a
	// version on probation (swapped in within its rollback window).
	OnUnhealthy func(m Manifest)
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
	if c.UnhealthyRetry <= 0 {
		c.UnhealthyRetry = 30 * time.Second
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
	// killed: the supervisor killed the process itself (a hang, a swap's
	// drain, Stop), so the calls it fails are not crashes of theirs.
	killed atomic.Bool
}

func (t *tracked) kill() {
	t.killed.Store(true)
	t.Kill()
}

// Supervisor keeps one plugin running: it restarts a crashed process with
// backoff (its in-flight entries stay pending and are reclaimed), marks a
// crash-looping plugin unhealthy, and swaps versions without dropping calls.
type Supervisor struct {
	cfg SupervisorConfig

	// swapMu serialises swaps.
	swapMu sync.Mutex
	// gate is held by every job that calls the plugin, alone or together
	// (see Gate).
	gate *Gate

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
	// quarantine is how long the next unhealthy mark lasts.
	quarantine time.Duration
	stopped    bool
}

// NewSupervisor starts the plugin once; an error means it never ran.
func NewSupervisor(ctx context.Context, cfg SupervisorConfig) (*Supervisor, error) {
	cfg.setDefaults()
	inst, err := Start(ctx, cfg.Plugin)
	if err != nil {
		return nil, err
	}
	return &Supervisor{cfg: cfg, cur: &tracked{Instance: inst, started: time.Now()}, healthy: true, gate: NewGate(), backoff: cfg.MinBackoff,
		quarantine: cfg.UnhealthyRetry}, nil
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

// CrashError is Invoke's error when the plugin process died while the
// call was in flight, without the supervisor killing it: the call's job may
// be what crashed it. Alone says the call was the only one in flight, so
// the crash is the job's own doing.
type CrashError struct {
	Plugin string
	Pid    int
	Alone  bool
	Err    error
}

func (e *CrashError) Error() string {
	how := "with other calls in flight"
	if e.Alone {
		how = "with no other call in flight"
	}
	return fmt.Sprintf("plugin %s (pid %d) crashed during the call, %s: %v", e.Plugin, e.Pid, how, e.Err)
}

func (e *CrashError) Unwrap() error { return e.Err }

type aloneKey struct{}

// Alone marks ctx so that Invoke runs its calls with no other call in
// flight on the plugin's process (waiting for those in flight, holding
// back new ones): a crash then is the job's own doing. The host runs an
// entry that was in flight during a crash this way.
func Alone(ctx context.Context) context.Context { return context.WithValue(ctx, aloneKey{}, true) }

// IsAlone reports whether ctx was marked by Alone.
func IsAlone(ctx context.Context) bool {
	alone, _ := ctx.Value(aloneKey{}).(bool)
	return alone
}

// crashSettle bounds how long a failed call waits to see whether the
// process exited (go-plugin notices an exit shortly after the connection
// breaks).
const crashSettle = 2 * time.Second

// Hold holds the plugin's gate for a job's whole run (see Gate); Invoke
// holds it for one call when the job did not.
func (s *Supervisor) Hold(ctx context.Context) (context.Context, func(), error) {
	return s.gate.Hold(ctx)
}

// Invoke sends calls to the current version. An error is a *CrashError
// when the process died under the call.
func (s *Supervisor) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	alone := IsAlone(ctx)
	ctx, release, err := s.gate.Hold(ctx)
	if err != nil {
		// Not the plugin's doing: the hang limit does not count it.
		return nil, err
	}
	defer release()
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
		answered(ctx, t.Manifest().Version)
	case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		if n := t.timeouts.Add(1); n >= int64(s.cfg.HangLimit) {
			s.cfg.Plugin.Logger.Error("plugin stopped answering; killing it so it is restarted",
				"plugin", t.Manifest().Name, "pid", t.Pid(), "timeouts_in_a_row", n)
			t.kill()
		}
	case TooLarge(err):
		// A message over the cap: the process is alive and answered.
	case ctx.Err() == nil && crashed(t):
		return nil, &CrashError{Plugin: t.Manifest().Name, Pid: t.Pid(), Alone: alone, Err: err}
	}
	return res, err
}

// TooLarge reports whether err, from Invoke, is gRPC's refusal of a
// message over contract.MaxMessageBytes in either direction: the call, or
// the plugin's answer, which carries every job's writes and which nothing
// else bounds. It is not a crash: the same calls fail the same way again.
func TooLarge(err error) bool { return status.Code(err) == codes.ResourceExhausted }

// crashed reports whether t's process exited by itself, waiting up to
// crashSettle for the exit to be seen.
func crashed(t *tracked) bool {
	deadline := time.Now().Add(crashSettle)
	for !t.Exited() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return !t.killed.Load()
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
	if s.stopped || !s.cur.Exited() {
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
		if now.Sub(s.cur.started) >= s.cfg.CrashWindow {
			// It ran stably: this crash is not part of a loop.
			s.backoff, s.quarantine = s.cfg.MinBackoff, s.cfg.UnhealthyRetry
		}
		if len(recent) >= s.cfg.CrashLoop {
			// Unhealthy, not for ever: a loop caused by a poison entry
			// ends once the host dead-letters it, and the restart
			// after the quarantine finds out without an operator.
			s.healthy = false
			s.nextStart = now.Add(s.quarantine)
			log.Error("plugin is crash-looping; marked unhealthy, its kinds wait in the stream; quarantined: restarted after retry_in, or at a reload",
				"plugin", name, "crashes", len(recent), "window", s.cfg.CrashWindow, "retry_in", s.quarantine)
			s.quarantine = min(s.quarantine*2, maxQuarantine)
			m := s.cur.Manifest()
			s.mu.Unlock()
			if s.cfg.OnUnhealthy != nil {
				s.cfg.OnUnhealthy(m)
			}
			return
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
	s.cfg.Plugin.Logger.Info("plugin restarted", "plugin", inst.Manifest().Name, "version", inst.Manifest().Version, "pid", inst.Pid(),
		"after_quarantine", !s.healthy)
	s.healthy = true
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
	s.healthy, s.crashes, s.nextStart, s.backoff, s.quarantine = true, nil, time.Time{}, s.cfg.MinBackoff, s.cfg.UnhealthyRetry
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
	old.kill()
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
	cur.kill()
}

// answeredKey carries where Invoke records the version that answered.
type answeredKey struct{}

// WithAnswered returns a context under which Supervisor.Invoke records the
// version of the plugin that answered each call: a swap may replace the
// version a job was routed to before its call goes out (a job run again
// alone after its batch was called off, say), and what the job's history
// names must be the version that ran it (AnsweredVersion).
func WithAnswered(ctx context.Context) context.Context {
	return context.WithValue(ctx, answeredKey{}, new(atomic.Pointer[string]))
}

// AnsweredVersion is the version that answered the last call made under
// ctx (WithAnswered); "" when none did.
func AnsweredVersion(ctx context.Context) string {
	if p, ok := ctx.Value(answeredKey{}).(*atomic.Pointer[string]); ok {
		if v := p.Load(); v != nil {
			return *v
		}
	}
	return ""
}

// answered records version in ctx's WithAnswered, when it has one.
func answered(ctx context.Context, version string) {
	if p, ok := ctx.Value(answeredKey{}).(*atomic.Pointer[string]); ok {
		p.Store(&version)
	}
}

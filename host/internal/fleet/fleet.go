// Package fleet is the host's plugins: it loads and admits them (their
// manifest, role, schema and grants), installs them, keeps the route table
// the job pipeline reads without a lock, reloads and watches the plugin
// directory, retries plugins refused for a reason that was not theirs,
// swaps versions, judges a version just swapped in (its probation) from the
// runs the pipeline reports, and rolls it back, all on its own goroutines:
// never on a job's. It starts only copies of the plugins' binaries it
// verified and kept itself (keep.go), and writes the swap history. It runs
// no job and writes no job's outcome.
package fleet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/internal/lifecycle"
	"github.com/usherhq/usher/host/internal/periodic"
	"github.com/usherhq/usher/host/internal/pipeline"
	"github.com/usherhq/usher/host/internal/route"
	"github.com/usherhq/usher/host/internal/telemetry"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/host/swaps"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Config configures a Fleet. The host fills every default (host.Config
// says each one); the fleet only validates.
type Config struct {
	// Pool is the host's pool (the runtime owner's login): admits,
	// installs and the swap history. Required.
	Pool *pgxpool.Pool
	// Handles serve the plugins' callbacks. Required.
	Handles *guard.Handles
	// Schema is the runtime's schema; Consumer this host's name, written
	// in the swap history.
	Schema, Consumer string
	// Plugins are binaries loaded without a manifest; Dir the plugin
	// directory of manifests (watched unless DisableWatch, every
	// PollInterval as a fallback).
	Plugins      []string
	Dir          string
	DisableWatch bool
	PollInterval time.Duration
	// Env and User: how the plugins' processes start (host.Config's
	// PluginEnv and PluginUser).
	Env  []string
	User string
	// CrashLoop, CrashWindow, UnhealthyRetry and DrainTimeout configure
	// each plugin's supervisor.
	CrashLoop                                 int
	CrashWindow, UnhealthyRetry, DrainTimeout time.Duration
	// PoolSize is each plugin's pool; StatementTimeout, LockTimeout and
	// IdleInTransactionTimeout bound its sessions (host.Config says each).
	PoolSize                                                int
	StatementTimeout, LockTimeout, IdleInTransactionTimeout time.Duration
	// RollbackWindow, RollbackMinJobs and RollbackFailureShare judge a
	// version swapped in (its probation).
	RollbackWindow       time.Duration
	RollbackMinJobs      int
	RollbackFailureShare float64
	// ParkedFor is how long an entry parked and not parked again counts
	// as parked now (route.Counters.ParkedFor). 0: for ever.
	ParkedFor time.Duration
	// RetryInterval is how often plugins refused for a transient reason
	// are loaded again.
	RetryInterval time.Duration
	Metrics       *telemetry.Metrics
	Logger        *slog.Logger
}

// loaded is one plugin the host serves.
type loaded struct {
	name string
	sup  *pluginhost.Supervisor
	// path, pcfg, prev, file and lastRollback change with swaps, under
	// Fleet.mu. path is the binary the running version was copied from;
	// pcfg how it starts (its kept copy, which the supervisor restarts);
	// prev how the version it replaced would start again (for a
	// rollback), nil when none; file the manifest it was loaded from, nil
	// for one from Config.Plugins. pcfg and prev each hold a reference to
	// their kept copy.
	path         string
	pcfg         pluginhost.Config
	prev         *previous
	lastRollback *RollbackStatus
	file         *pluginhost.DirPlugin
	// probation judges the version swapped in last; nil when it was not or
	// was rolled back.
	probation atomic.Pointer[probation]
	counters  route.Counters
	// db is the plugin's own pool, logged in as its role; it outlives
	// swaps (every version of a plugin runs as the same role).
	db guard.DB
}

// Fleet is the host's plugins.
type Fleet struct {
	cfg    Config
	log    *slog.Logger
	routes route.Table

	// mu guards plugins and the refusals' bookkeeping, and the fields of
	// a loaded that change with swaps. byName is plugins published for
	// lock-free readers (OnProbation, judge).
	mu      sync.RWMutex
	plugins map[string]*loaded
	byName  atomic.Pointer[map[string]*loaded]
	// refusals are the plugins that could not load at New.
	refusals []Refusal
	// refusedManifests holds, per plugin, the manifest a load or swap last
	// refused and why: the watcher does not try it again until it
	// changes (an operator's Reload does).
	refusedManifests map[string]refusedManifest
	// retryPaths are the binaries of Config.Plugins refused for a reason
	// that was not theirs, which retryRefused loads again.
	retryPaths []string
	// dirProblems are the plugin directory's problems last logged.
	dirProblems map[string]bool
	// runCtx is Run's context while it runs; supervisors, the plugins'
	// supervisors running under it.
	runCtx, supCtx context.Context
	supervisors    *sync.WaitGroup

	// changeMu serialises the changes of the fleet (loads by the
	// watcher, reloads, swaps and rollbacks).
	changeMu sync.Mutex
	// kept holds the verified copies of the binaries the plugins start
	// from (keep.go); removed by Close.
	kept keeper

	watcher *pluginhost.Watcher
	// observations carries the pipeline's reports to judge; tasks are the
	// rollbacks under way.
	observations chan pipeline.Observation
	tasks        lifecycle.Tasks

	// pins are the versions running beside the ones serving new work, to
	// decide the workflows pinned to them (pinned.go), under pinMu.
	pinMu sync.Mutex
	pins  map[pinKey]*pin
}

var _ pipeline.Fleet = (*Fleet)(nil)

// New loads Config.Plugins and every plugin Dir's manifests name. A plugin
// that cannot load is logged and left out (Refusals): no single plugin
// stops the host. Only a directory that cannot be read is an error.
func New(ctx context.Context, cfg Config) (*Fleet, error) {
	if cfg.Pool == nil || cfg.Handles == nil || cfg.Metrics == nil || cfg.Logger == nil {
		return nil, errors.New("fleet: needs a Pool, Handles, Metrics and a Logger")
	}
	f := &Fleet{cfg: cfg, log: cfg.Logger, plugins: map[string]*loaded{}, refusedManifests: map[string]refusedManifest{},
		observations: make(chan pipeline.Observation, 1024)}
	f.publish()
	if err := f.loadPlugins(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Routes is the route table the pipeline reads.
func (f *Fleet) Routes() *route.Table { return &f.routes }

// publish makes plugins visible to the lock-free readers; the caller
// holds mu (or is New).
func (f *Fleet) publish() {
	m := make(map[string]*loaded, len(f.plugins))
	for k, v := range f.plugins {
		m[k] = v
	}
	f.byName.Store(&m)
}

// loaded is the plugin name, without a lock.
func (f *Fleet) loaded(name string) *loaded {
	return (*f.byName.Load())[name]
}

// Run supervises the plugins, watches the plugin directory, retries the
// refused plugins and judges the versions on probation until ctx is done; then
// it waits for the rollbacks under way and stops the plugins' processes.
// The host stops the stream's consumer before: no job is in flight then.
func (f *Fleet) Run(ctx context.Context) error {
	// The plugins' processes stop last, once nothing can swap them.
	supCtx, stopPlugins := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPlugins()
	var sups sync.WaitGroup
	f.mu.Lock()
	f.runCtx, f.supCtx, f.supervisors = ctx, supCtx, &sups
	for _, l := range f.plugins {
		f.supervise(l.sup)
	}
	f.mu.Unlock()
	var loops sync.WaitGroup
	errs := make(chan error, 3)
	goLoop := func(name string, run func(context.Context) error) {
		loops.Add(1)
		go func() {
			defer loops.Done()
			if err := run(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	if f.watcher != nil {
		goLoop("plugin-watch", f.watcher.Run)
	}
	if f.cfg.Dir != "" || len(f.cfg.Plugins) > 0 {
		goLoop("plugin-retry", f.retryRefused)
	}
	goLoop("pinned-retire", f.retirePinned)
	for done := false; !done; {
		select {
		case o := <-f.observations:
			f.judge(o)
		case <-ctx.Done():
			done = true
		}
	}
	loops.Wait()
	f.changeMu.Lock() // no load, swap or rollback is under way from here
	f.mu.Lock()
	f.runCtx = nil
	f.mu.Unlock()
	f.changeMu.Unlock()
	f.tasks.Wait()
	f.mu.Lock()
	f.supCtx, f.supervisors = nil, nil
	f.mu.Unlock()
	stopPlugins()
	sups.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// supervise runs sup under Run's context, when Run runs; the caller holds
// mu.
func (f *Fleet) supervise(sup *pluginhost.Supervisor) {
	if f.supCtx == nil {
		return
	}
	wg, ctx := f.supervisors, f.supCtx
	wg.Add(1)
	go func() {
		defer wg.Done()
		sup.Run(ctx)
	}()
}

// Observe hands a run to the judging goroutine; it never blocks (a report
// the goroutine has no room for is dropped: the probation is judged on the
// others).
func (f *Fleet) Observe(o pipeline.Observation) {
	if l := f.loaded(o.Plugin); l == nil || l.probation.Load() == nil {
		return // nothing on probation: the common case costs no send
	}
	select {
	case f.observations <- o:
	default:
	}
}

// Close stops every plugin's process, closes their pools and removes the
// kept binaries. Call it after Run returned (or instead of Run).
func (f *Fleet) Close() {
	f.stopPinned()
	f.mu.RLock()
	for _, l := range f.plugins {
		l.sup.Stop()
		l.db.Pool.Close()
	}
	f.mu.RUnlock()
	f.kept.removeAll()
}

// loadPlugins starts Config.Plugins and every plugin PluginDir's manifests
// name. A plugin that cannot load is logged and left out: no single plugin
// stops the host. Only a directory that cannot be read is an error.
func (f *Fleet) loadPlugins(ctx context.Context) error {
	for _, p := range f.cfg.Plugins {
		if err := f.LoadPlugin(ctx, p); err != nil {
			f.refusePlugin(p, err)
			f.retryLater(p, err)
		}
	}
	if f.cfg.Dir == "" {
		return nil
	}
	if !f.cfg.DisableWatch {
		// Created before the scan: a change made from here on is reloaded
		// once Run watches.
		w, err := pluginhost.NewWatcher(pluginhost.WatchConfig{
			Dir: f.cfg.Dir, PollInterval: f.cfg.PollInterval, Logger: f.log,
			OnChange: f.onPluginDirChange,
		})
		if err != nil {
			return fmt.Errorf("host: %w", err)
		}
		f.watcher = w
	}
	scan, err := pluginhost.ScanDir(f.cfg.Dir)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	f.logProblems(scan.Problems)
	for _, p := range scan.Plugins {
		if err := f.loadManifest(ctx, p); err != nil {
			f.refusePlugin(p.ManifestPath, err)
			f.mu.Lock()
			f.refusedManifests[p.Manifest.Name] = refusedManifest{p: p, reason: err.Error(), transient: transientLoad(err)}
			f.mu.Unlock()
		}
	}
	return nil
}

// logProblems logs what the plugin directory's scan skipped, each problem
// once until it goes away: a binary left without a manifest is not logged
// again at every re-read.
func (f *Fleet) logProblems(problems []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	for _, p := range problems {
		msg := p.Error()
		seen[msg] = true
		if !f.dirProblems[msg] {
			f.log.Warn("plugin directory: skipped", "dir", f.cfg.Dir, "problem", msg)
		}
	}
	f.dirProblems = seen
}

// Refusal is a plugin that could not load when the host started.
type Refusal struct {
	// Source is the binary (Config.Plugins) or manifest file.
	Source string `json:"source"`
	Error  string `json:"error"`
}

func (f *Fleet) refusePlugin(source string, err error) {
	f.log.Error("plugin refused; the host serves without it", "source", source, "err", err)
	f.mu.Lock()
	f.refusals = append(f.refusals, Refusal{Source: source, Error: err.Error()})
	f.mu.Unlock()
}

// Refusals lists the plugins that could not load when the host started,
// with why, and have not loaded since (a refusal that was not the
// plugin's doing is tried again: retryRefused). A refused plugin never
// stops the host: the others serve.
func (f *Fleet) Refusals() []Refusal {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return append([]Refusal(nil), f.refusals...)
}

func (f *Fleet) pluginConfig(path string) pluginhost.Config {
	return pluginhost.Config{Path: path, Host: f.cfg.Handles, Logger: f.log, Env: f.cfg.Env, User: f.cfg.User}
}

// LoadPlugin starts the plugin binary at path (no manifest, no checksum)
// and routes its kinds to it. The bytes read at load are the version: the
// host keeps a copy of them and restarts only that copy, whatever becomes
// of path. It refuses a plugin that declares a kind without a guard or a
// kind another plugin serves (here, or pinned to another plugin's role in
// the database), and one whose Postgres role is missing or unfit
// (sandbox.CheckPluginRole).
func (f *Fleet) LoadPlugin(ctx context.Context, path string) error {
	if err := f.load(ctx, f.pluginConfig(path), nil); err != nil {
		return fmt.Errorf("host: load plugin %s: %w", path, err)
	}
	return nil
}

// LoadInProcess serves the plugin serve returns inside the host's own
// process (sdk/inprocess makes one of an *sdk.Plugin): the same handles,
// the plugin's own database role and pool, the same guards, but calls are
// method calls instead of gRPC between processes. It exists so that
// cmd/bench can measure what the plugin boundary costs; an in-process
// plugin is not isolated from the host, so never load untrusted code so.
func (f *Fleet) LoadInProcess(ctx context.Context, name string, serve func(usherv1.HostClient) usherv1.PluginServer) error {
	pcfg := f.pluginConfig("in-process:" + name)
	pcfg.InProcess = serve
	if err := f.load(ctx, pcfg, nil); err != nil {
		return fmt.Errorf("host: load in-process plugin %s: %w", name, err)
	}
	return nil
}

// loadManifest loads the plugin a manifest in PluginDir names: its binary
// is verified against the manifest's SHA-256 before it starts, and must
// report the manifest's name and version.
func (f *Fleet) loadManifest(ctx context.Context, p pluginhost.DirPlugin) error {
	pcfg, err := p.Config(f.pluginConfig(""))
	if err == nil {
		err = f.load(ctx, pcfg, &p)
	}
	if err != nil {
		return fmt.Errorf("host: load plugin from manifest %s: %w", p.ManifestPath, err)
	}
	return nil
}

// load starts the version pcfg describes from a kept copy of its binary
// and routes its kinds to it.
func (f *Fleet) load(ctx context.Context, pcfg pluginhost.Config, file *pluginhost.DirPlugin) (err error) {
	kept, err := f.kept.keep(pcfg)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.kept.release(kept.Path)
		}
	}()
	sup, err := pluginhost.NewSupervisor(ctx, pluginhost.SupervisorConfig{
		Plugin: kept, CrashLoop: f.cfg.CrashLoop, CrashWindow: f.cfg.CrashWindow, UnhealthyRetry: f.cfg.UnhealthyRetry,
		DrainTimeout: f.cfg.DrainTimeout,
		OnRestart: func(m pluginhost.Manifest, pid int) {
			f.cfg.Metrics.Restarts.WithLabelValues(m.Name).Inc()
		},
		OnUnhealthy: func(m pluginhost.Manifest) { f.onUnhealthy(m.Name, m) },
	})
	if err != nil {
		return err
	}
	m := sup.Manifest()
	db, err := f.admit(ctx, m, file, true)
	if err != nil {
		sup.Stop()
		return err
	}
	f.storeBinary(ctx, m, kept)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.plugins[m.Name]; dup {
		sup.Stop()
		return fmt.Errorf("plugin %s is already loaded", m.Name)
	}
	for _, k := range m.Kinds {
		if r, taken := f.routes.Get(k.Kind); taken {
			sup.Stop()
			return fmt.Errorf("plugin %s declares kind %q, already served by %s", m.Name, k.Kind, r.Name)
		}
	}
	l := &loaded{name: m.Name, sup: sup, path: pcfg.Path, pcfg: kept, file: file, db: db}
	l.counters.ParkedFor = f.cfg.ParkedFor
	// A refusal at start of what loads now is forgotten before its kinds
	// are served: whoever sees them served sees no refusal of them.
	source := pcfg.Path
	if file != nil {
		source = file.ManifestPath
	}
	f.forgetRefusal(source)
	f.routes.Update(func(t map[string]route.Route) {
		for _, k := range m.Kinds {
			t[k.Kind] = route.Route{Name: m.Name, Plugin: sup, DB: db, Guard: k.Guard, Counters: &l.counters}
		}
	})
	f.plugins[m.Name] = l
	f.publish()
	f.supervise(sup)
	f.log.Info("plugin loaded", "plugin", m.Name, "version", m.Version, "protocol", m.Protocol, "pid", sup.Pid(),
		"kinds", len(m.Kinds), "db_role", db.Role, "db_pool_size", db.Pool.Config().MaxConns, "verified", file != nil, "kept", kept.Path)
	return nil
}

// admit decides whether the plugin m (started from the manifest file, when
// there is one) may serve: its kinds must be the manifest's, its role must
// be fit (sandbox.CheckPluginRole), the manifest's schema, migrations and
// grants must install (plugindb.Install), and its kinds are pinned to that
// role. A rollback (install false) installs nothing. It returns the
// plugin's database: the pool of a plugin already loaded (a swap), or a
// new one.
func (f *Fleet) admit(ctx context.Context, m pluginhost.Manifest, file *pluginhost.DirPlugin, install bool) (guard.DB, error) {
	kinds := make([]string, len(m.Kinds))
	for i, k := range m.Kinds {
		kinds[i] = k.Kind
	}
	var enqueues []string
	if file != nil {
		if err := file.Manifest.CheckKinds(kinds); err != nil {
			return guard.DB{}, err
		}
		enqueues = file.Manifest.Enqueues
	}
	if err := sandbox.CheckPluginName(m.Name); err != nil {
		return guard.DB{}, err
	}
	role, err := sandbox.PluginRoleOf(ctx, f.cfg.Pool, m.Name)
	if err != nil {
		return guard.DB{}, err
	}
	if err := sandbox.CheckPluginRole(ctx, f.cfg.Pool, m.Name, role); err != nil {
		return guard.DB{}, err
	}
	if file != nil && install {
		// The same install as `host plugins install`: its schema, its
		// migrations and its declared grants, or a refusal with why. The
		// binary running is the manifest's: go-plugin checked it.
		spec, err := plugindb.FromManifest(*file)
		if err != nil {
			return guard.DB{}, err
		}
		res, err := plugindb.Install(ctx, f.cfg.Pool, spec)
		if err != nil {
			return guard.DB{}, err
		}
		if !res.Unchanged {
			f.log.Info("plugin installed", "plugin", m.Name, "version", m.Version, "migrations_applied", res.Applied,
				"granted", res.Granted, "revoked", res.Revoked)
		}
	}
	if err := sandbox.Prepare(ctx, f.cfg.Pool, m.Name, role, kinds, enqueues); err != nil {
		return guard.DB{}, err
	}
	f.mu.RLock()
	l := f.plugins[m.Name]
	f.mu.RUnlock()
	if l != nil {
		return l.db, nil
	}
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: f.cfg.Pool.Config(), Role: role,
		Size: int32(f.cfg.PoolSize), StatementTimeout: f.cfg.StatementTimeout, LockTimeout: f.cfg.LockTimeout,
		IdleInTransactionTimeout: f.cfg.IdleInTransactionTimeout, Schema: f.cfg.Schema, Plugin: m.Name, Logger: f.log})
	if err != nil {
		return guard.DB{}, err
	}
	return guard.DB{Pool: pool, Role: role}, nil
}

// Kinds lists the kinds this host serves.
func (f *Fleet) Kinds() []string { return f.routes.Kinds() }

// PluginStatus describes one loaded plugin.
type PluginStatus struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Protocol is the host-plugin protocol negotiated with it.
	Protocol int    `json:"protocol"`
	Path     string `json:"path"`
	// Manifest is the manifest file it was loaded from, empty for
	// Config.Plugins; SHA256 the checksum its binary was verified against
	// (the manifest's, or for Config.Plugins the bytes read at load).
	Manifest string `json:"manifest,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	// Kept is the host's verified copy of the binary, copied from Path,
	// that it runs and restarts; empty for an in-process plugin.
	Kept string `json:"kept,omitempty"`
	// DBRole is the Postgres login role its statements run as, on a pool
	// of its own of DBPoolSize connections.
	DBRole     string `json:"db_role"`
	DBPoolSize int32  `json:"db_pool_size"`
	Pid        int    `json:"pid"`
	Healthy    bool   `json:"healthy"`
	Restarts   int    `json:"restarts"`
	// Parked counts deliveries of its kinds left waiting in the stream
	// (it was unhealthy or restarting, or a kind paused or at its limit)
	// since the host started: it grows each time a waiting entry is read
	// again. ParkedNow counts the entries waiting now; InFlight its
	// jobs running on this host now.
	Parked    int64    `json:"parked"`
	ParkedNow int64    `json:"parked_now"`
	InFlight  int64    `json:"in_flight"`
	Kinds     []string `json:"kinds"`
	// Previous is the version a rollback would go back to (the one the
	// last swap replaced); ProbationUntil, while set, is when the running
	// version stops being judged for an automatic rollback.
	Previous       string     `json:"previous,omitempty"`
	ProbationUntil *time.Time `json:"probation_until,omitempty"`
	// LastRollback is the last rollback, automatic or asked for.
	LastRollback *RollbackStatus `json:"last_rollback,omitempty"`
	// Refused is the manifest version last refused (by a load, a swap or
	// a rollback) and why, while it is refused.
	Refused       string `json:"refused,omitempty"`
	RefusedReason string `json:"refused_reason,omitempty"`
	// Swaps are the plugin's last swaps, rollbacks and refusals on any
	// host of the cluster, newest first (the plugin_swaps table, see
	// host/swaps); filled in by the admin API and the console, not by
	// Plugins.
	Swaps []swaps.Swap `json:"swaps"`
}

// SwapHistory is how many swaps of each plugin PluginReport lists.
const SwapHistory = 10

// PluginReport is Plugins with each plugin's swap history read from the
// database: what the admin API's /plugins answers and the console shows.
// A history that cannot be read is logged and left empty: the plugins'
// state is this host's and still worth reporting.
func (f *Fleet) PluginReport(ctx context.Context) []PluginStatus {
	list := f.Plugins()
	names := make([]string, len(list))
	for i, p := range list {
		names[i] = p.Name
	}
	hist, err := swaps.Last(ctx, f.cfg.Pool, names, SwapHistory)
	if err != nil {
		f.log.Warn("could not read the plugins' swap history", "err", err)
	}
	for i := range list {
		list[i].Swaps = hist[list[i].Name]
		if list[i].Swaps == nil {
			list[i].Swaps = []swaps.Swap{}
		}
	}
	return list
}

// recordSwap writes s to the swap history, with this host's name.
func (f *Fleet) recordSwap(ctx context.Context, s swaps.Swap) {
	s.Host = f.cfg.Consumer
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := swaps.Record(wctx, f.cfg.Pool, s); err != nil {
		f.log.Warn("could not record the plugin swap in its history", "plugin", s.Plugin, "action", s.Action, "err", err)
	}
}

// Plugins reports the loaded plugins.
func (f *Fleet) Plugins() []PluginStatus {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []PluginStatus
	for name, l := range f.plugins {
		m := l.sup.Manifest()
		st := PluginStatus{Name: name, Version: m.Version, Protocol: m.Protocol, Path: l.path, DBRole: l.db.Role, DBPoolSize: l.db.Pool.Config().MaxConns,
			Pid: l.sup.Pid(), Healthy: l.sup.Healthy(), Restarts: l.sup.Restarts(), Parked: l.counters.Parked.Load(), ParkedNow: l.counters.ParkedNow(time.Now()),
			InFlight: l.counters.InFlight.Load()}
		if l.file != nil {
			st.Manifest = l.file.ManifestPath
		}
		if len(l.pcfg.SHA256) > 0 {
			st.SHA256, st.Kept = hex.EncodeToString(l.pcfg.SHA256), l.pcfg.Path
		}
		if l.prev != nil {
			st.Previous = l.prev.version
		}
		if p := l.probation.Load(); p != nil && time.Now().Before(p.until) && !p.decided.Load() {
			until := p.until.UTC()
			st.ProbationUntil = &until
		}
		if l.lastRollback != nil {
			r := *l.lastRollback
			st.LastRollback = &r
		}
		if r, ok := f.refusedManifests[name]; ok {
			st.Refused, st.RefusedReason = r.p.Manifest.Version, r.reason
		}
		for _, k := range m.Kinds {
			st.Kinds = append(st.Kinds, k.Kind+" ("+telemetry.GuardName(k.Guard)+")")
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Swap replaces the named plugin with the binary at path (no manifest, no
// checksum: a kept copy of the bytes read, as LoadPlugin) while jobs keep
// flowing; see pluginhost.Supervisor.Swap. The version it replaces stays
// restartable (Rollback), and the new one is on probation for
// Config.RollbackWindow: rolled back by itself if it fails.
func (f *Fleet) Swap(ctx context.Context, name, path string) (pluginhost.SwapResult, error) {
	f.changeMu.Lock()
	defer f.changeMu.Unlock()
	res, err := f.swap(ctx, name, f.pluginConfig(path), nil)
	if err == nil {
		f.recordSwap(ctx, swaps.Swap{Plugin: name, Action: swaps.Swapped, From: res.From.Version, To: res.To.Version, Cause: swaps.CauseSwap})
	}
	return res, err
}

func (f *Fleet) swap(ctx context.Context, name string, pcfg pluginhost.Config, file *pluginhost.DirPlugin) (pluginhost.SwapResult, error) {
	f.mu.RLock()
	l := f.plugins[name]
	f.mu.RUnlock()
	if l == nil {
		return pluginhost.SwapResult{}, fmt.Errorf("host: no plugin %q is loaded", name)
	}
	return f.swapIn(ctx, l, pcfg, pcfg.Path, file, true)
}

// swapIn swaps l to the version pcfg starts, copied from the binary at
// source. A forward swap keeps a verified copy of pcfg's binary and starts
// that, keeps the version it replaces restartable (l.prev) and puts the new
// one on probation for RollbackWindow; a rollback (forward false) starts
// pcfg as it is (the previous version's kept copy) and keeps neither.
func (f *Fleet) swapIn(ctx context.Context, l *loaded, pcfg pluginhost.Config, source string, file *pluginhost.DirPlugin, forward bool) (pluginhost.SwapResult, error) {
	f.mu.RLock()
	cur, old := l.pcfg, l.prev
	prev := &previous{pcfg: cur, source: l.path, file: l.file, version: l.sup.Manifest().Version}
	f.mu.RUnlock()
	if forward {
		kept, err := f.kept.keep(pcfg)
		if err != nil {
			return pluginhost.SwapResult{}, fmt.Errorf("swap refused, old version keeps serving: %w", err)
		}
		pcfg = kept
	}
	begin := time.Now()
	res, err := l.sup.Swap(ctx, pcfg, func(m pluginhost.Manifest) error {
		// A rollback keeps the schema and grants of the version it
		// rolls back from: migrations run forward only.
		_, err := f.admit(ctx, m, file, forward)
		return err
	})
	if err != nil {
		if forward {
			f.kept.release(pcfg.Path)
		}
		return res, err
	}
	f.mu.Lock()
	l.path, l.pcfg, l.file = source, pcfg, file
	l.prev = nil
	l.probation.Store(nil)
	var window time.Duration
	if forward {
		// cur's reference moves to prev; the version before it is no
		// longer restartable.
		l.prev = prev
		if old != nil {
			f.kept.release(old.pcfg.Path)
		}
		if window = f.cfg.RollbackWindow; window > 0 {
			// Judged from when new calls went to it.
			since := begin.Add(res.StartTime)
			l.probation.Store(&probation{version: res.To.Version, since: since, until: since.Add(window)})
		}
	} else {
		// prev's reference (pcfg's) moves to the running version; the
		// version rolled back from is not kept.
		f.kept.release(cur.Path)
	}
	f.mu.Unlock()
	f.storeBinary(ctx, l.sup.Manifest(), pcfg)
	f.log.Info("plugin swapped", "plugin", l.name, "from", res.From.Version, "to", res.To.Version,
		"start_time", res.StartTime, "drained", res.Drained, "drain_time", res.DrainTime, "rollback", !forward, "probation", window,
		"kept", pcfg.Path)
	return res, nil
}

// ReloadResult is what a reload did to one plugin.
type ReloadResult struct {
	Plugin string `json:"plugin"`
	// Action is "loaded" (a new plugin), "swapped" (a new version or
	// binary, or a forced restart of an unhealthy plugin), "unchanged",
	// "refused" (Error says why; the running version, if any, keeps
	// serving), or, from Rollback, "rolled back".
	Action string `json:"action"`
	// From and To are the versions before and after.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// StartTime, Drained and DrainTime are the swap's (see
	// pluginhost.SwapResult).
	StartTime time.Duration `json:"start_time_ns,omitempty"`
	Drained   bool          `json:"drained,omitempty"`
	DrainTime time.Duration `json:"drain_time_ns,omitempty"`
	Error     string        `json:"error,omitempty"`
	// Again: refused before for the same manifest, and not tried again.
	Again bool `json:"again,omitempty"`
	// transient: refused for a reason that was not the plugin's
	// (transientLoad).
	transient bool
}

// Reload re-reads PluginDir's manifests (only the one naming plugin name,
// when name is set) and applies what changed: a manifest for a plugin not
// loaded loads it, one whose version, checksum or binary differs from the
// running plugin's swaps to it (Supervisor.Swap: start, check, route, drain,
// stop), and an unchanged one is left alone unless its plugin is unhealthy,
// in which case it is restarted from the same binary (the fix was outside
// the binary). A manifest that disappeared leaves its plugin serving.
//
// A refused load or swap is reported in its result, not as the error; the
// error is for a reload that could not run (no PluginDir, no manifest
// naming name).
func (f *Fleet) Reload(ctx context.Context, name string) ([]ReloadResult, error) {
	f.changeMu.Lock()
	defer f.changeMu.Unlock()
	return f.reload(ctx, name, true)
}

// onPluginDirChange is the watcher's reload: of every manifest, and
// without restarting unchanged unhealthy plugins (a poll must not turn a
// crash loop into a swap loop).
func (f *Fleet) onPluginDirChange(ctx context.Context) {
	f.changeMu.Lock()
	defer f.changeMu.Unlock()
	f.log.Info("plugin directory changed; reloading manifests", "dir", f.cfg.Dir)
	if _, err := f.reload(ctx, "", false); err != nil {
		f.log.Error("plugin reload failed", "dir", f.cfg.Dir, "err", err)
	}
}

// retryRefused loads again, every PluginRetryInterval, each plugin (a
// manifest of PluginDir, or a binary of Config.Plugins) refused for a
// reason that was not the plugin's: the database could not be reached or
// was restarting (transientLoad). A host started while Postgres restarts
// serves its plugins once Postgres is back, not only after an operator's
// reload; a plugin refused for what it is (a wrong checksum, a role
// without its grants) is not tried again.
func (f *Fleet) retryRefused(ctx context.Context) error {
	return periodic.Run(ctx, f.cfg.RetryInterval, f.log, "retrying refused plugins failed", func(ctx context.Context) error {
		f.changeMu.Lock()
		defer f.changeMu.Unlock()
		f.mu.Lock()
		var names []string
		for name, r := range f.refusedManifests {
			if r.transient {
				names = append(names, name)
			}
		}
		paths := f.retryPaths
		f.retryPaths = nil
		f.mu.Unlock()
		for _, name := range names {
			f.mu.Lock()
			r, ok := f.refusedManifests[name]
			if ok && r.transient {
				delete(f.refusedManifests, name)
			}
			f.mu.Unlock()
			if !ok || !r.transient {
				continue
			}
			res, err := f.reload(ctx, name, false)
			if err != nil {
				f.log.Warn("retrying a refused plugin failed", "plugin", name, "err", err)
				continue
			}
			for _, x := range res {
				if x.Action == "loaded" || x.Action == "swapped" {
					f.log.Info("plugin loaded on a retry", "plugin", x.Plugin, "version", x.To, "refused_for", r.reason)
				}
			}
		}
		for _, path := range paths {
			if err := f.LoadPlugin(ctx, path); err != nil {
				f.log.Warn("plugin refused again", "source", path, "err", err, "retried", transientLoad(err))
				f.retryLater(path, err)
				continue
			}
			f.log.Info("plugin loaded on a retry", "source", path)
		}
		return nil
	})
}

// retryLater puts the binary at path (Config.Plugins), refused with err,
// on retryRefused's list when err was not the plugin's doing.
func (f *Fleet) retryLater(path string, err error) {
	if !transientLoad(err) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retryPaths = append(f.retryPaths, path)
}

// forgetRefusal drops the start's refusal of the plugin at source (a
// binary or a manifest): it loads now. The caller holds mu.
func (f *Fleet) forgetRefusal(source string) {
	f.refusals = slices.DeleteFunc(f.refusals, func(r Refusal) bool { return r.Source == source })
}

// transientLoad reports whether a plugin's load failed for a reason that
// is not the plugin's and may pass: the database could not be reached,
// was shutting down or starting up, or had no connection to spare.
func transientLoad(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "53"), // insufficient resources (too many connections)
			strings.HasPrefix(pgErr.Code, "57"): // operator intervention (shutdown, starting up)
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

func (f *Fleet) reload(ctx context.Context, name string, force bool) ([]ReloadResult, error) {
	if f.cfg.Dir == "" {
		return nil, errors.New("host: no plugin directory is configured; nothing to reload")
	}
	scan, err := pluginhost.ScanDir(f.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	f.logProblems(scan.Problems)
	var out []ReloadResult
	for _, p := range scan.Plugins {
		if name != "" && p.Manifest.Name != name {
			continue
		}
		r := f.syncManifest(ctx, p, force)
		switch {
		case r.Action == "refused" && r.Again:
			f.log.Debug("plugin manifest refused before; not tried again", "plugin", r.Plugin, "to", r.To)
		case r.Action == "refused":
			f.log.Error("plugin reload refused; the running version, if any, keeps serving",
				"plugin", r.Plugin, "to", r.To, "err", r.Error)
		}
		out = append(out, r)
	}
	if name != "" && len(out) == 0 {
		return nil, fmt.Errorf("host: no valid manifest in %s names plugin %q%s", f.cfg.Dir, name, problemList(scan.Problems))
	}
	return out, nil
}

func problemList(ps []error) string {
	if len(ps) == 0 {
		return ""
	}
	var s []string
	for _, p := range ps {
		s = append(s, p.Error())
	}
	return " (skipped: " + strings.Join(s, "; ") + ")"
}

// refusedManifest is a manifest a load or swap refused, and why.
// transient: the refusal was not the plugin's doing (see transientLoad),
// and retryRefused tries it again.
type refusedManifest struct {
	p         pluginhost.DirPlugin
	reason    string
	transient bool
}

// syncManifest makes the running plugin match its manifest p. A manifest
// refused before is refused again, without a new attempt, unless force (an
// operator's Reload): an answer once given does not change behind the
// operator's back.
func (f *Fleet) syncManifest(ctx context.Context, p pluginhost.DirPlugin, force bool) ReloadResult {
	res := f.syncManifestOnce(ctx, p, force)
	cause := swaps.CauseDirChange
	if force {
		cause = swaps.CauseReload
	}
	switch {
	case res.Action == "swapped":
		f.recordSwap(ctx, swaps.Swap{Plugin: res.Plugin, Action: swaps.Swapped, From: res.From, To: res.To, Cause: cause, SHA256: p.Manifest.SHA256})
	case res.Action == "refused" && !res.Again:
		f.recordSwap(ctx, swaps.Swap{Plugin: res.Plugin, Action: swaps.Refused, From: res.From, To: res.To, Cause: cause,
			Reason: res.Error, SHA256: p.Manifest.SHA256})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if res.Action == "refused" {
		if r, ok := f.refusedManifests[res.Plugin]; !ok || !r.p.Same(p) || force {
			f.refusedManifests[res.Plugin] = refusedManifest{p: p, reason: res.Error, transient: res.transient}
		}
	} else {
		delete(f.refusedManifests, res.Plugin)
	}
	return res
}

func (f *Fleet) syncManifestOnce(ctx context.Context, p pluginhost.DirPlugin, force bool) ReloadResult {
	name := p.Manifest.Name
	res := ReloadResult{Plugin: name, To: p.Manifest.Version}
	f.mu.RLock()
	r, refused := f.refusedManifests[name]
	f.mu.RUnlock()
	if refused && !force && r.p.Same(p) {
		res.Action, res.Error, res.Again = "refused", r.reason+" (refused before; not tried again until the manifest changes or `plugins reload` asks)", true
		return res
	}
	f.mu.RLock()
	l := f.plugins[name]
	var cur pluginhost.Manifest
	var same bool
	if l != nil {
		cur = l.sup.Manifest()
		same = l.file != nil && l.file.Same(p)
	}
	f.mu.RUnlock()
	if l == nil {
		if err := f.loadManifest(ctx, p); err != nil {
			res.Action, res.Error, res.transient = "refused", err.Error(), transientLoad(err)
			return res
		}
		res.Action = "loaded"
		return res
	}
	res.From = cur.Version
	if same && (!force || l.sup.Healthy()) {
		res.Action = "unchanged"
		return res
	}
	pcfg, err := p.Config(f.pluginConfig(""))
	if err != nil {
		res.Action, res.Error = "refused", fmt.Sprintf("manifest %s: %v", p.ManifestPath, err)
		return res
	}
	sw, err := f.swap(ctx, name, pcfg, &p)
	if err != nil {
		res.Action, res.Error, res.transient = "refused", fmt.Sprintf("manifest %s: %v", p.ManifestPath, err), transientLoad(err)
		return res
	}
	res.Action, res.StartTime, res.Drained, res.DrainTime = "swapped", sw.StartTime, sw.Drained, sw.DrainTime
	return res
}

// Automatic rollback: a swap checks only that the new version starts and
// answers. What it does with jobs is judged afterwards, for
// Config.RollbackWindow: the version it replaced stays restartable from its
// verified binary, and if the new one crash-loops, or fails
// Config.RollbackFailureShare of its first Config.RollbackMinJobs jobs or
// more with errors (abandoned runs, crashes, transient errors; not the
// jobs' own permanent failures or the retries a handler asked for), the
// host swaps back by itself. The manifest rolled back from is refused
// until it changes, as a refused swap is: the watcher does not try it
// again behind the operator's back.

// Rollback causes, the label of usher_plugin_rollbacks_total.
const (
	rollbackCrashLoop = "crash_loop"
	rollbackFailures  = "failures"
	rollbackCrashes   = "crashes"
	rollbackRequested = "requested"
)

// previous is the version a swap replaced: how to start it again (pcfg
// starts its kept copy), the binary that was copied from, and its
// manifest.
type previous struct {
	pcfg    pluginhost.Config
	source  string
	file    *pluginhost.DirPlugin
	version string
}

// probation is the judgement of a version just swapped in.
type probation struct {
	version      string
	since, until time.Time
	jobs, failed atomic.Int64
	// decided: a rollback was asked for; the version is judged once.
	decided atomic.Bool
}

// RollbackStatus is a plugin's last rollback.
type RollbackStatus struct {
	At   time.Time `json:"at"`
	From string    `json:"from"`
	To   string    `json:"to"`
	// Cause is crash_loop, failures, crashes (an entry crashed the new
	// version PoisonCrashes times) or requested (plugins rollback).
	Cause  string `json:"cause"`
	Reason string `json:"reason"`
}

// judge counts a run's observation against its plugin's version on
// probation, on the fleet's own goroutine (Run). A run that started before the
// swap ran on the old version, or partly, and says nothing of the new one.
func (f *Fleet) judge(o pipeline.Observation) {
	l := f.loaded(o.Plugin)
	if l == nil {
		return
	}
	p := l.probation.Load()
	if p == nil || o.Start.Before(p.since) || time.Now().After(p.until) || p.decided.Load() {
		return
	}
	if o.Crashes > 0 {
		f.autoRollback(l.name, p, rollbackCrashes, fmt.Sprintf("job %.64s crashed it %d times (last: %s)", o.JobID, o.Crashes, o.Last))
		return
	}
	failed := p.failed.Load()
	if o.Failed {
		failed = p.failed.Add(1)
	}
	jobs := p.jobs.Add(1)
	if jobs < int64(f.cfg.RollbackMinJobs) || float64(failed) < f.cfg.RollbackFailureShare*float64(jobs) {
		return
	}
	f.autoRollback(l.name, p, rollbackFailures, fmt.Sprintf("%d of its first %d jobs failed with errors (crashes, abandoned runs, transient errors) within %s of the swap",
		failed, jobs, time.Since(p.since).Round(time.Millisecond)))
}

// onUnhealthy is the supervisor's news of a crash loop.
func (f *Fleet) onUnhealthy(name string, m pluginhost.Manifest) {
	var p *probation
	if l := f.loaded(name); l != nil {
		p = l.probation.Load()
	}
	if p == nil || p.version != m.Version || time.Now().After(p.until) {
		return
	}
	f.autoRollback(name, p, rollbackCrashLoop, fmt.Sprintf("it crash-looped (marked unhealthy) %s after the swap",
		time.Since(p.since).Round(time.Millisecond)))
}

// OnProbation reports whether the version serving kind is on probation now:
// swapped in within RollbackWindow (judged to be rolled back or not). It
// takes no lock.
func (f *Fleet) OnProbation(kind string) bool {
	rt, ok := f.routes.Get(kind)
	if !ok {
		return false
	}
	l := f.loaded(rt.Name)
	if l == nil {
		return false
	}
	p := l.probation.Load()
	return p != nil && time.Now().Before(p.until)
}

// autoRollback rolls plugin name back from the version on probation p, once,
// on a goroutine of the fleet's (a swap drains the jobs of the version it
// replaces, and the judging goroutine must not wait for that).
func (f *Fleet) autoRollback(name string, p *probation, cause, reason string) {
	if !p.decided.CompareAndSwap(false, true) {
		return
	}
	f.mu.Lock()
	ctx := f.runCtx
	if ctx == nil || ctx.Err() != nil {
		f.mu.Unlock()
		return // stopping: the next start loads what the directory says
	}
	f.log.Warn("plugin version on probation fails; rolling back", "plugin", name, "version", p.version, "cause", cause, "reason", reason)
	defer f.mu.Unlock()
	// Started under mu: Run waits for the tasks after clearing runCtx.
	f.tasks.Go(func() {
		f.changeMu.Lock()
		defer f.changeMu.Unlock()
		f.mu.RLock()
		stopping := f.runCtx == nil
		f.mu.RUnlock()
		if stopping {
			return // the next start loads what the directory says
		}
		if _, err := f.rollback(context.WithoutCancel(ctx), name, p, cause, reason); err != nil {
			f.log.Error("automatic rollback failed; the new version keeps serving", "plugin", name, "version", p.version, "err", err)
		}
	})
}

// Rollback swaps plugin name back to the version its last swap replaced,
// on request, and refuses the manifest it rolls back from until that
// changes (or a reload asks for it). A plugin that was not swapped since it
// loaded, or was rolled back already, has nothing to roll back to.
func (f *Fleet) Rollback(ctx context.Context, name string) (ReloadResult, error) {
	f.changeMu.Lock()
	defer f.changeMu.Unlock()
	return f.rollback(ctx, name, nil, rollbackRequested, "asked for (plugins rollback)")
}

// rollback swaps name back to its previous version; when p is set, only if
// that probation is still the plugin's (no swap came in between). The
// caller holds changeMu.
func (f *Fleet) rollback(ctx context.Context, name string, p *probation, cause, reason string) (ReloadResult, error) {
	f.mu.RLock()
	l := f.plugins[name]
	var prev *previous
	var from *pluginhost.DirPlugin
	if l != nil {
		prev, from = l.prev, l.file
	}
	current := l != nil && (p == nil || l.probation.Load() == p)
	f.mu.RUnlock()
	switch {
	case l == nil:
		return ReloadResult{}, fmt.Errorf("host: no plugin %q is loaded", name)
	case !current:
		return ReloadResult{}, errors.New("host: another swap replaced the version on probation; not rolled back")
	case prev == nil:
		return ReloadResult{}, fmt.Errorf("host: plugin %s has no previous version to roll back to (none since it loaded, or rolled back already)", name)
	}
	res := ReloadResult{Plugin: name, From: l.sup.Manifest().Version, To: prev.version}
	sw, err := f.swapIn(ctx, l, prev.pcfg, prev.source, prev.file, false)
	if err != nil {
		return res, fmt.Errorf("host: roll back %s to %s: %w", name, prev.version, err)
	}
	res.Action, res.StartTime, res.Drained, res.DrainTime = "rolled back", sw.StartTime, sw.Drained, sw.DrainTime
	st := &RollbackStatus{At: time.Now().UTC(), From: sw.From.Version, To: sw.To.Version, Cause: cause, Reason: reason}
	f.mu.Lock()
	l.lastRollback = st
	if from != nil {
		f.refusedManifests[name] = refusedManifest{p: *from, reason: fmt.Sprintf("rolled back from %s to %s (%s): %s", st.From, st.To, cause, reason)}
	}
	f.mu.Unlock()
	f.cfg.Metrics.Rollbacks.WithLabelValues(name, cause).Inc()
	f.recordSwap(ctx, swaps.Swap{Plugin: name, Action: swaps.RolledBack, From: st.From, To: st.To, Cause: cause, Reason: reason,
		SHA256: hex.EncodeToString(prev.pcfg.SHA256)})
	f.log.Error("plugin rolled back; the version rolled back from is refused until its manifest changes or a reload asks for it",
		"plugin", name, "from", st.From, "to", st.To, "cause", cause, "reason", reason, "start_time", sw.StartTime, "drain_time", sw.DrainTime)
	return res, nil
}

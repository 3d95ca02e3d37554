// Package host is the usher runtime as a library: build a Host from a
// Config, run it under your context, and it owns the stream consumer, the
// reclaim loop, the outbox relay, the scheduler, dead letters, every
// transaction boundary, and the handler plugins it starts as separate
// processes. cmd/host is a thin binary over it.
package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/console"
	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/internal/periodic"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/reclaim"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/host/swaps"
	"github.com/usherhq/usher/migrations"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// route is where a kind's jobs go.
type route struct {
	plugin *pluginhost.Supervisor
	db     guard.DB
	guard  usherv1.Guard
	// parked counts the deliveries of the plugin's kinds left waiting
	// while it was unhealthy or restarting.
	parked *atomic.Int64
	// l is the plugin (its version on probation, for judge).
	l *loaded
}

// loaded is one plugin the host serves.
type loaded struct {
	name string
	sup  *pluginhost.Supervisor
	path string
	// pcfg is how the running version was started; prev how the version
	// it replaced would start again (for a rollback), nil when none.
	pcfg pluginhost.Config
	prev *previous
	// prob judges the version swapped in last, nil when it was not or
	// was rolled back; lastRollback is the last rollback.
	prob         *probation
	lastRollback *RollbackStatus
	// file is the manifest the plugin was loaded from; nil for one from
	// Config.Plugins.
	file   *pluginhost.DirPlugin
	parked atomic.Int64
	// stalled counts the plugin's jobs in flight for longer than
	// Config.StalledAfter (see stalledCap); inflight all its jobs running
	// on this host.
	stalled  atomic.Int64
	inflight atomic.Int64
	// db is the plugin's own pool, logged in as its role; it outlives
	// swaps (every version of a plugin runs as the same role).
	db guard.DB
}

// Host is a running usher runtime.
type Host struct {
	cfg     Config
	log     *slog.Logger
	pool    *pgxpool.Pool
	ownPool bool
	rdb     redis.UniversalClient
	ownRdb  bool
	handles *guard.Handles
	runner  *guard.Runner
	metrics *metrics
	tracer  trace.Tracer
	// key signs and verifies stream entries (Config.SigningKey).
	key []byte

	mu      sync.RWMutex
	routes  map[string]route
	plugins map[string]*loaded
	// runCtx is Run's context while it runs (entries run again after a
	// plugin's restart under it); redispatching holds their stream ids.
	// schema is the runtime's (the host login's current_schema()).
	schema            string
	runCtx            context.Context
	redispatching     sync.Map
	redispatchWaiting atomic.Int64
	// pluginCtx and pluginWG are set while Run runs: a plugin loaded then
	// is supervised under them.
	pluginCtx context.Context
	pluginWG  *sync.WaitGroup
	adminAddr string
	// adminToken is the admin API's resolved token (Config.AdminToken or
	// the file's); set by New when AdminAddr is set.
	adminToken string

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

	// reloadMu serialises reloads (the watcher's and the admin API's)
	// and rollbacks.
	reloadMu sync.Mutex
	// keepDir holds copies of the binaries of versions swapped out, for
	// a rollback (keepBinary); removed by Close.
	keepMu  sync.Mutex
	keepDir string
	keepSeq int

	watcher *pluginhost.Watcher

	consumer *stream.Consumer
}

// New connects to Postgres and Redis, applies migrations, and starts the
// plugins. Nothing is read from the stream until Run.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	var adminToken string
	if cfg.AdminAddr != "" {
		var err error
		if adminToken, err = resolveAdminToken(&cfg); err != nil {
			return nil, err
		}
	}
	h := &Host{adminToken: adminToken, cfg: cfg, log: cfg.Logger, pool: cfg.Pool, rdb: cfg.Redis, metrics: newMetrics(),
		refusedManifests: map[string]refusedManifest{},
		tracer:           otel.Tracer("github.com/usherhq/usher/host"),
		routes:           map[string]route{}, plugins: map[string]*loaded{}}
	h.metrics.entryBytes(func() int64 { held, _ := h.EntryBytes(); return held })
	h.metrics.kindWait(h)
	if h.pool == nil {
		pool, err := newHostPool(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("host: postgres: %w", err)
		}
		h.pool, h.ownPool = pool, true
	}
	if h.rdb == nil {
		opt, err := RedisOptions(cfg.RedisURL, cfg.RedisCAFile)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("host: %w", err)
		}
		h.rdb, h.ownRdb = redis.NewClient(opt), true
	}
	if err := h.pool.Ping(ctx); err != nil {
		h.Close()
		return nil, postgresError(err)
	}
	if err := h.rdb.Ping(ctx).Err(); err != nil {
		h.Close()
		return nil, fmt.Errorf("host: redis unreachable: %w", err)
	}
	user, schema, err := sandbox.CheckHostLogin(ctx, h.pool, cfg.AllowSuperuser)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("host: %w", err)
	}
	if user != "" && cfg.AllowSuperuser {
		h.log.Warn("the host's database login may be a superuser (AllowSuperuser): one escape from a plugin's role is the whole cluster", "user", user)
	}
	if err := migrations.Up(ctx, h.pool); err != nil {
		h.Close()
		return nil, err
	}
	h.key = cfg.SigningKey
	if h.key == nil {
		if h.key, err = outbox.LoadSigningKey(ctx, h.pool); err != nil {
			h.Close()
			return nil, fmt.Errorf("host: %w", err)
		}
		h.log.Info("stream signing key loaded from the database (runtime_secrets)")
	} else {
		h.log.Info("stream signing key taken from the configuration")
	}
	h.schema = schema
	h.handles = guard.NewHandles(schema, h.log)
	runner, err := guard.NewRunner(guard.Config{
		Handles: h.handles, StatementTimeout: cfg.StatementTimeout,
		TransientBackoff: cfg.RetryBackoff, OnAbsorbed: h.recordAbsorbed, Logger: h.log,
		BatchMax: cfg.BatchMax, Solo: pluginhost.IsAlone, StalledAfter: cfg.StalledAfter, Arriving: h.arriving, GatherWait: cfg.BatchWait,
		OnBatch: func(b guard.BatchReport) {
			result := "committed"
			if !b.Committed {
				result = "split"
			}
			h.metrics.batches.WithLabelValues(b.Role, result).Observe(float64(b.Jobs))
			if b.Committed {
				h.metrics.observePhases(b.Role, b.Phases)
			}
		},
	})
	if err != nil {
		h.Close()
		return nil, err
	}
	h.runner = runner
	if err := h.loadPlugins(ctx); err != nil {
		h.Close()
		return nil, err
	}
	// The host's own pool serves the relay, scheduler, reconciler and
	// bookkeeping; each plugin's jobs run on its own (logged at load).
	h.log.Info("host ready", "config", cfg, "kinds", h.Kinds(), "protocols", pluginhost.Protocols(),
		"host_pool_size", h.pool.Config().MaxConns, "plugin_pool_size", cfg.PluginPoolSize,
		"max_connections", ConnectionBudget(int(h.pool.Config().MaxConns), len(h.Plugins()), cfg.PluginPoolSize))
	return h, nil
}

// loadPlugins starts Config.Plugins and every plugin PluginDir's manifests
// name. A plugin that cannot load is logged and left out: no single plugin
// stops the host. Only a directory that cannot be read is an error.
func (h *Host) loadPlugins(ctx context.Context) error {
	for _, p := range h.cfg.Plugins {
		if err := h.LoadPlugin(ctx, p); err != nil {
			h.refusePlugin(p, err)
			h.retryLater(p, err)
		}
	}
	if h.cfg.PluginDir == "" {
		return nil
	}
	if !h.cfg.DisablePluginWatch {
		// Created before the scan: a change made from here on is reloaded
		// once Run watches.
		w, err := pluginhost.NewWatcher(pluginhost.WatchConfig{
			Dir: h.cfg.PluginDir, PollInterval: h.cfg.PluginPollInterval, Logger: h.log,
			OnChange: h.onPluginDirChange,
		})
		if err != nil {
			return fmt.Errorf("host: %w", err)
		}
		h.watcher = w
	}
	scan, err := pluginhost.ScanDir(h.cfg.PluginDir)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	h.logProblems(scan.Problems)
	for _, p := range scan.Plugins {
		if err := h.loadManifest(ctx, p); err != nil {
			h.refusePlugin(p.ManifestPath, err)
			h.mu.Lock()
			h.refusedManifests[p.Manifest.Name] = refusedManifest{p: p, reason: err.Error(), transient: transientLoad(err)}
			h.mu.Unlock()
		}
	}
	return nil
}

// logProblems logs what the plugin directory's scan skipped, each problem
// once until it goes away: a binary left without a manifest is not logged
// again at every re-read.
func (h *Host) logProblems(problems []error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, p := range problems {
		msg := p.Error()
		seen[msg] = true
		if !h.dirProblems[msg] {
			h.log.Warn("plugin directory: skipped", "dir", h.cfg.PluginDir, "problem", msg)
		}
	}
	h.dirProblems = seen
}

// Refusal is a plugin that could not load when the host started.
type Refusal struct {
	// Source is the binary (Config.Plugins) or manifest file.
	Source string `json:"source"`
	Error  string `json:"error"`
}

func (h *Host) refusePlugin(source string, err error) {
	h.log.Error("plugin refused; the host serves without it", "source", source, "err", err)
	h.mu.Lock()
	h.refusals = append(h.refusals, Refusal{Source: source, Error: err.Error()})
	h.mu.Unlock()
}

// Refusals lists the plugins that could not load when the host started,
// with why, and have not loaded since (a refusal that was not the
// plugin's doing is tried again: retryRefused). A refused plugin never
// stops the host: the others serve.
func (h *Host) Refusals() []Refusal {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return append([]Refusal(nil), h.refusals...)
}

func (h *Host) pluginConfig(path string) pluginhost.Config {
	return pluginhost.Config{Path: path, Host: h.handles, Logger: h.log, Env: h.cfg.PluginEnv, User: h.cfg.PluginUser}
}

// LoadPlugin starts the plugin binary at path (no manifest, no checksum)
// and routes its kinds to it. It refuses a plugin that declares a kind
// without a guard or a kind another plugin serves (here, or pinned to
// another plugin's role in the database), and one whose Postgres role is
// missing or unfit (sandbox.CheckPluginRole).
func (h *Host) LoadPlugin(ctx context.Context, path string) error {
	if err := h.load(ctx, h.pluginConfig(path), nil); err != nil {
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
func (h *Host) LoadInProcess(ctx context.Context, name string, serve func(usherv1.HostClient) usherv1.PluginServer) error {
	pcfg := h.pluginConfig("in-process:" + name)
	pcfg.InProcess = serve
	if err := h.load(ctx, pcfg, nil); err != nil {
		return fmt.Errorf("host: load in-process plugin %s: %w", name, err)
	}
	return nil
}

// loadManifest loads the plugin a manifest in PluginDir names: its binary
// is verified against the manifest's SHA-256 before it starts, and must
// report the manifest's name and version.
func (h *Host) loadManifest(ctx context.Context, p pluginhost.DirPlugin) error {
	pcfg, err := p.Config(h.pluginConfig(""))
	if err == nil {
		err = h.load(ctx, pcfg, &p)
	}
	if err != nil {
		return fmt.Errorf("host: load plugin from manifest %s: %w", p.ManifestPath, err)
	}
	return nil
}

func (h *Host) load(ctx context.Context, pcfg pluginhost.Config, file *pluginhost.DirPlugin) error {
	sup, err := pluginhost.NewSupervisor(ctx, pluginhost.SupervisorConfig{
		Plugin: pcfg, CrashLoop: h.cfg.PluginCrashLoop, CrashWindow: h.cfg.PluginCrashWindow, UnhealthyRetry: h.cfg.PluginUnhealthyRetry,
		DrainTimeout: h.cfg.PluginDrainTimeout,
		OnRestart: func(m pluginhost.Manifest, pid int) {
			h.metrics.restarts.WithLabelValues(m.Name).Inc()
		},
		OnUnhealthy: func(m pluginhost.Manifest) { h.onUnhealthy(m.Name, m) },
	})
	if err != nil {
		return err
	}
	m := sup.Manifest()
	db, err := h.admit(ctx, m, file, true)
	if err != nil {
		sup.Stop()
		return err
	}
	sup.SetDBRole(db.Role)
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.plugins[m.Name]; dup {
		sup.Stop()
		return fmt.Errorf("plugin %s is already loaded", m.Name)
	}
	for _, k := range m.Kinds {
		if r, taken := h.routes[k.Kind]; taken {
			sup.Stop()
			return fmt.Errorf("plugin %s declares kind %q, already served by %s", m.Name, k.Kind, r.plugin.Manifest().Name)
		}
	}
	l := &loaded{name: m.Name, sup: sup, path: pcfg.Path, pcfg: pcfg, file: file, db: db}
	for _, k := range m.Kinds {
		h.routes[k.Kind] = route{plugin: sup, db: db, guard: k.Guard, parked: &l.parked, l: l}
	}
	h.plugins[m.Name] = l
	if ctx, wg := h.pluginCtx, h.pluginWG; ctx != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sup.Run(ctx)
		}()
	}
	h.log.Info("plugin loaded", "plugin", m.Name, "version", m.Version, "protocol", m.Protocol, "pid", sup.Pid(),
		"kinds", len(m.Kinds), "db_role", db.Role, "db_pool_size", db.Pool.Config().MaxConns, "verified", file != nil)
	return nil
}

// admit decides whether the plugin m (started from the manifest file, when
// there is one) may serve: its kinds must be the manifest's, its role must
// be fit (sandbox.CheckPluginRole), the manifest's schema, migrations and
// grants must install (plugindb.Install), and its kinds are pinned to that
// role. A rollback (install false) installs nothing. It returns the
// plugin's database: the pool of a plugin already loaded (a swap), or a
// new one.
func (h *Host) admit(ctx context.Context, m pluginhost.Manifest, file *pluginhost.DirPlugin, install bool) (guard.DB, error) {
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
	role, err := sandbox.PluginRoleOf(ctx, h.pool, m.Name)
	if err != nil {
		return guard.DB{}, err
	}
	if err := sandbox.CheckPluginRole(ctx, h.pool, m.Name, role); err != nil {
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
		res, err := plugindb.Install(ctx, h.pool, spec)
		if err != nil {
			return guard.DB{}, err
		}
		if !res.Unchanged {
			h.log.Info("plugin installed", "plugin", m.Name, "version", m.Version, "migrations_applied", res.Applied,
				"granted", res.Granted, "revoked", res.Revoked)
		}
	}
	if err := sandbox.Prepare(ctx, h.pool, m.Name, role, kinds, enqueues); err != nil {
		return guard.DB{}, err
	}
	h.mu.RLock()
	l := h.plugins[m.Name]
	h.mu.RUnlock()
	if l != nil {
		return l.db, nil
	}
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: h.pool.Config(), Role: role,
		Size: int32(h.cfg.PluginPoolSize), StatementTimeout: h.cfg.StatementTimeout, Schema: h.schema, Plugin: m.Name, Logger: h.log,
		LockTimeout: h.cfg.LockTimeout, IdleInTransactionTimeout: h.cfg.IdleInTransactionTimeout})
	if err != nil {
		return guard.DB{}, err
	}
	return guard.DB{Pool: pool, Role: role}, nil
}

// PluginRole is the Postgres login role plugin name's statements run as:
// see sandbox.PluginRole.
func PluginRole(name string) string { return sandbox.PluginRole(name) }

// Kinds lists the kinds this host serves.
func (h *Host) Kinds() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.routes))
	for k := range h.routes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// PluginStatus describes one loaded plugin.
type PluginStatus struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Protocol is the host-plugin protocol negotiated with it.
	Protocol int    `json:"protocol"`
	Path     string `json:"path"`
	// Manifest and SHA256: the manifest file it was loaded from and the
	// checksum verified before it started; empty for Config.Plugins.
	Manifest string `json:"manifest,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	// DBRole is the Postgres login role its statements run as, on a pool
	// of its own of DBPoolSize connections.
	DBRole     string `json:"db_role"`
	DBPoolSize int32  `json:"db_pool_size"`
	Pid        int    `json:"pid"`
	Healthy    bool   `json:"healthy"`
	Restarts   int    `json:"restarts"`
	// Parked counts deliveries of its kinds left waiting in the stream
	// while it was unhealthy or restarting; InFlight its jobs running on
	// this host now.
	Parked   int64    `json:"parked"`
	InFlight int64    `json:"in_flight"`
	Kinds    []string `json:"kinds"`
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
func (h *Host) PluginReport(ctx context.Context) []PluginStatus {
	list := h.Plugins()
	names := make([]string, len(list))
	for i, p := range list {
		names[i] = p.Name
	}
	hist, err := swaps.Last(ctx, h.pool, names, SwapHistory)
	if err != nil {
		h.log.Warn("could not read the plugins' swap history", "err", err)
	}
	for i := range list {
		list[i].Swaps = hist[list[i].Name]
		if list[i].Swaps == nil {
			list[i].Swaps = []swaps.Swap{}
		}
	}
	return list
}

// trimSwaps deletes the swap history older than HistoryRetention, every
// 10 minutes: a swap is kept as long as the jobs it ran.
func (h *Host) trimSwaps(ctx context.Context) error {
	return periodic.Run(ctx, 10*time.Minute, h.log, "plugin swap history trim failed", func(ctx context.Context) error {
		_, err := swaps.Trim(ctx, h.pool, time.Now().Add(-h.cfg.HistoryRetention))
		return err
	})
}

// recordSwap writes s to the swap history, with this host's name.
func (h *Host) recordSwap(ctx context.Context, s swaps.Swap) {
	s.Host = h.cfg.Consumer
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := swaps.Record(wctx, h.pool, s); err != nil {
		h.log.Warn("could not record the plugin swap in its history", "plugin", s.Plugin, "action", s.Action, "err", err)
	}
}

// Plugins reports the loaded plugins.
func (h *Host) Plugins() []PluginStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []PluginStatus
	for name, l := range h.plugins {
		m := l.sup.Manifest()
		st := PluginStatus{Name: name, Version: m.Version, Protocol: m.Protocol, Path: l.path, DBRole: l.db.Role, DBPoolSize: l.db.Pool.Config().MaxConns,
			Pid: l.sup.Pid(), Healthy: l.sup.Healthy(), Restarts: l.sup.Restarts(), Parked: l.parked.Load(), InFlight: l.inflight.Load()}
		if l.file != nil {
			st.Manifest, st.SHA256 = l.file.ManifestPath, l.file.Manifest.SHA256
		}
		if l.prev != nil {
			st.Previous = l.prev.version
		}
		if p := l.prob; p != nil && time.Now().Before(p.until) && !p.decided.Load() {
			until := p.until.UTC()
			st.ProbationUntil = &until
		}
		if l.lastRollback != nil {
			r := *l.lastRollback
			st.LastRollback = &r
		}
		if r, ok := h.refusedManifests[name]; ok {
			st.Refused, st.RefusedReason = r.p.Manifest.Version, r.reason
		}
		for _, k := range m.Kinds {
			st.Kinds = append(st.Kinds, k.Kind+" ("+guardName(k.Guard)+")")
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Swap replaces the named plugin with the binary at path (no manifest, no
// checksum) while jobs keep flowing; see pluginhost.Supervisor.Swap. The
// version it replaces stays restartable (Rollback), and the new one is on
// probation for Config.RollbackWindow: rolled back by itself if it fails.
func (h *Host) Swap(ctx context.Context, name, path string) (pluginhost.SwapResult, error) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	res, err := h.swap(ctx, name, h.pluginConfig(path), nil)
	if err == nil {
		h.recordSwap(ctx, swaps.Swap{Plugin: name, Action: swaps.Swapped, From: res.From.Version, To: res.To.Version, Cause: swaps.CauseSwap})
	}
	return res, err
}

func (h *Host) swap(ctx context.Context, name string, pcfg pluginhost.Config, file *pluginhost.DirPlugin) (pluginhost.SwapResult, error) {
	h.mu.RLock()
	l := h.plugins[name]
	h.mu.RUnlock()
	if l == nil {
		return pluginhost.SwapResult{}, fmt.Errorf("host: no plugin %q is loaded", name)
	}
	return h.swapIn(ctx, l, pcfg, file, true)
}

// swapIn swaps l to the version pcfg starts. A forward swap keeps the
// version it replaces restartable (l.prev) and puts the new one on
// probation for RollbackWindow; a rollback (forward false) keeps neither.
func (h *Host) swapIn(ctx context.Context, l *loaded, pcfg pluginhost.Config, file *pluginhost.DirPlugin, forward bool) (pluginhost.SwapResult, error) {
	h.mu.RLock()
	cur, old := l.pcfg, l.prev
	prev := &previous{pcfg: cur, file: l.file, version: l.sup.Manifest().Version}
	h.mu.RUnlock()
	if forward {
		prev.pcfg = h.keepBinary(cur, l.sup.Pid())
	}
	// Kept binaries no version refers to after the swap are removed.
	candidates := []string{cur.Path, prev.pcfg.Path}
	if old != nil {
		candidates = append(candidates, old.pcfg.Path)
	}
	defer func() {
		h.mu.RLock()
		inUse := map[string]bool{l.pcfg.Path: true}
		if l.prev != nil {
			inUse[l.prev.pcfg.Path] = true
		}
		h.mu.RUnlock()
		for _, c := range candidates {
			if !inUse[c] {
				h.dropKept(c)
			}
		}
	}()
	begin := time.Now()
	res, err := l.sup.Swap(ctx, pcfg, func(m pluginhost.Manifest) error {
		// A rollback keeps the schema and grants of the version it
		// rolls back from: migrations run forward only.
		_, err := h.admit(ctx, m, file, forward)
		return err
	})
	if err != nil {
		return res, err
	}
	h.mu.Lock()
	l.path, l.pcfg, l.file = pcfg.Path, pcfg, file
	l.prev, l.prob = nil, nil
	var window time.Duration
	if forward {
		l.prev = prev
		if window = h.cfg.RollbackWindow; window > 0 {
			// Judged from when new calls went to it.
			since := begin.Add(res.StartTime)
			l.prob = &probation{version: res.To.Version, since: since, until: since.Add(window)}
		}
	}
	h.mu.Unlock()
	h.log.Info("plugin swapped", "plugin", l.name, "from", res.From.Version, "to", res.To.Version,
		"start_time", res.StartTime, "drained", res.Drained, "drain_time", res.DrainTime, "rollback", !forward, "probation", window)
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
func (h *Host) Reload(ctx context.Context, name string) ([]ReloadResult, error) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	return h.reload(ctx, name, true)
}

// onPluginDirChange is the watcher's reload: of every manifest, and
// without restarting unchanged unhealthy plugins (a poll must not turn a
// crash loop into a swap loop).
func (h *Host) onPluginDirChange(ctx context.Context) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	h.log.Info("plugin directory changed; reloading manifests", "dir", h.cfg.PluginDir)
	if _, err := h.reload(ctx, "", false); err != nil {
		h.log.Error("plugin reload failed", "dir", h.cfg.PluginDir, "err", err)
	}
}

// retryRefused loads again, every PluginRetryInterval, each plugin (a
// manifest of PluginDir, or a binary of Config.Plugins) refused for a
// reason that was not the plugin's: the database could not be reached or
// was restarting (transientLoad). A host started while Postgres restarts
// serves its plugins once Postgres is back, not only after an operator's
// reload; a plugin refused for what it is (a wrong checksum, a role
// without its grants) is not tried again.
func (h *Host) retryRefused(ctx context.Context) error {
	return periodic.Run(ctx, h.cfg.PluginRetryInterval, h.log, "retrying refused plugins failed", func(ctx context.Context) error {
		h.reloadMu.Lock()
		defer h.reloadMu.Unlock()
		h.mu.Lock()
		var names []string
		for name, r := range h.refusedManifests {
			if r.transient {
				names = append(names, name)
			}
		}
		paths := h.retryPaths
		h.retryPaths = nil
		h.mu.Unlock()
		for _, name := range names {
			h.mu.Lock()
			r, ok := h.refusedManifests[name]
			if ok && r.transient {
				delete(h.refusedManifests, name)
			}
			h.mu.Unlock()
			if !ok || !r.transient {
				continue
			}
			res, err := h.reload(ctx, name, false)
			if err != nil {
				h.log.Warn("retrying a refused plugin failed", "plugin", name, "err", err)
				continue
			}
			for _, x := range res {
				if x.Action == "loaded" || x.Action == "swapped" {
					h.log.Info("plugin loaded on a retry", "plugin", x.Plugin, "version", x.To, "refused_for", r.reason)
					h.forgetRefusal(r.p.ManifestPath)
				}
			}
		}
		for _, path := range paths {
			if err := h.LoadPlugin(ctx, path); err != nil {
				h.log.Warn("plugin refused again", "source", path, "err", err, "retried", transientLoad(err))
				h.retryLater(path, err)
				continue
			}
			h.log.Info("plugin loaded on a retry", "source", path)
			h.forgetRefusal(path)
		}
		return nil
	})
}

// retryLater puts the binary at path (Config.Plugins), refused with err,
// on retryRefused's list when err was not the plugin's doing.
func (h *Host) retryLater(path string, err error) {
	if !transientLoad(err) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.retryPaths = append(h.retryPaths, path)
}

// forgetRefusal drops the start's refusal of the manifest at source: it
// has loaded since.
func (h *Host) forgetRefusal(source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refusals = slices.DeleteFunc(h.refusals, func(r Refusal) bool { return r.Source == source })
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

func (h *Host) reload(ctx context.Context, name string, force bool) ([]ReloadResult, error) {
	if h.cfg.PluginDir == "" {
		return nil, errors.New("host: no plugin directory is configured; nothing to reload")
	}
	scan, err := pluginhost.ScanDir(h.cfg.PluginDir)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h.logProblems(scan.Problems)
	var out []ReloadResult
	for _, p := range scan.Plugins {
		if name != "" && p.Manifest.Name != name {
			continue
		}
		r := h.reconcile(ctx, p, force)
		switch {
		case r.Action == "refused" && r.Again:
			h.log.Debug("plugin manifest refused before; not tried again", "plugin", r.Plugin, "to", r.To)
		case r.Action == "refused":
			h.log.Error("plugin reload refused; the running version, if any, keeps serving",
				"plugin", r.Plugin, "to", r.To, "err", r.Error)
		}
		out = append(out, r)
	}
	if name != "" && len(out) == 0 {
		return nil, fmt.Errorf("host: no valid manifest in %s names plugin %q%s", h.cfg.PluginDir, name, problemList(scan.Problems))
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

// reconcile makes the running plugin match its manifest p. A manifest
// refused before is refused again, without a new attempt, unless force (an
// operator's Reload): an answer once given does not change behind the
// operator's back.
func (h *Host) reconcile(ctx context.Context, p pluginhost.DirPlugin, force bool) ReloadResult {
	res := h.reconcileOnce(ctx, p, force)
	cause := swaps.CauseDirChange
	if force {
		cause = swaps.CauseReload
	}
	switch {
	case res.Action == "swapped":
		h.recordSwap(ctx, swaps.Swap{Plugin: res.Plugin, Action: swaps.Swapped, From: res.From, To: res.To, Cause: cause, SHA256: p.Manifest.SHA256})
	case res.Action == "refused" && !res.Again:
		h.recordSwap(ctx, swaps.Swap{Plugin: res.Plugin, Action: swaps.Refused, From: res.From, To: res.To, Cause: cause,
			Reason: res.Error, SHA256: p.Manifest.SHA256})
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if res.Action == "refused" {
		if r, ok := h.refusedManifests[res.Plugin]; !ok || !r.p.Same(p) || force {
			h.refusedManifests[res.Plugin] = refusedManifest{p: p, reason: res.Error, transient: res.transient}
		}
	} else {
		delete(h.refusedManifests, res.Plugin)
	}
	return res
}

func (h *Host) reconcileOnce(ctx context.Context, p pluginhost.DirPlugin, force bool) ReloadResult {
	name := p.Manifest.Name
	res := ReloadResult{Plugin: name, To: p.Manifest.Version}
	h.mu.RLock()
	r, refused := h.refusedManifests[name]
	h.mu.RUnlock()
	if refused && !force && r.p.Same(p) {
		res.Action, res.Error, res.Again = "refused", r.reason+" (refused before; not tried again until the manifest changes or `plugins reload` asks)", true
		return res
	}
	h.mu.RLock()
	l := h.plugins[name]
	var cur pluginhost.Manifest
	var same bool
	if l != nil {
		cur = l.sup.Manifest()
		same = l.file != nil && l.file.Same(p)
	}
	h.mu.RUnlock()
	if l == nil {
		if err := h.loadManifest(ctx, p); err != nil {
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
	pcfg, err := p.Config(h.pluginConfig(""))
	if err != nil {
		res.Action, res.Error = "refused", fmt.Sprintf("manifest %s: %v", p.ManifestPath, err)
		return res
	}
	sw, err := h.swap(ctx, name, pcfg, &p)
	if err != nil {
		res.Action, res.Error, res.transient = "refused", fmt.Sprintf("manifest %s: %v", p.ManifestPath, err), transientLoad(err)
		return res
	}
	res.Action, res.StartTime, res.Drained, res.DrainTime = "swapped", sw.StartTime, sw.Drained, sw.DrainTime
	return res
}

// EntryBytes reports what the stream consumer holds of its byte budget
// (Config.MaxEntryBytesHeld) now, and the most it has held; zeros before
// Run.
func (h *Host) EntryBytes() (held, peak int64) {
	c := h.liveConsumer()
	if c == nil {
		return 0, 0
	}
	return c.BytesHeld(), c.PeakBytesHeld()
}

// arriving is stream.Consumer.Arriving of the consumer Run made; 0 before
// Run.
func (h *Host) arriving() (int, <-chan struct{}) {
	c := h.liveConsumer()
	if c == nil {
		return 0, nil
	}
	return c.Arriving()
}

// liveConsumer is the stream consumer Run made; nil before Run.
func (h *Host) liveConsumer() *stream.Consumer {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.consumer
}

// Pool returns the host's Postgres pool.
func (h *Host) Pool() *pgxpool.Pool { return h.pool }

// Redis returns the host's Redis client.
func (h *Host) Redis() redis.UniversalClient { return h.rdb }

// Run serves until ctx is done, then stops reading, gives in-flight jobs a
// grace period (those that do not finish stay unacked and are reclaimed),
// stops the plugins and returns.
func (h *Host) Run(ctx context.Context) error {
	consumer, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: h.rdb, Stream: h.cfg.Stream, Group: h.cfg.Group, Name: h.cfg.Consumer,
		Concurrency: h.cfg.Concurrency, MaxBytes: h.cfg.MaxEntryBytesHeld, IdlePoll: h.cfg.IdlePoll,
		Dispatch: h.dispatch, ShutdownGrace: h.cfg.ShutdownGrace, Logger: h.log,
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.consumer = consumer
	h.mu.Unlock()
	if err := stream.EnsureGroup(ctx, h.rdb, h.cfg.Stream, h.cfg.Group); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: nothing was read, nothing to drain
		}
		return err
	}
	rec, err := reclaim.New(reclaim.Config{
		Redis: h.rdb, Stream: h.cfg.Stream, Group: h.cfg.Group, Consumer: h.cfg.Consumer,
		MinIdle: h.cfg.ReclaimIdle, Interval: h.cfg.ReclaimInterval, Take: consumer.Take,
		OnReclaimed: func(n int) { h.metrics.reclaimed.Add(float64(n)) }, Logger: h.log,
	})
	if err != nil {
		return err
	}
	loops := map[string]func(context.Context) error{"consumer": consumer.Run, "reclaim": rec.Run}
	if !h.cfg.DisableRelay {
		relay, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: h.pool, Redis: h.rdb, Stream: h.cfg.Stream, Key: h.key, PollInterval: h.cfg.RelayPollInterval,
			AfterPublish: h.cfg.RelayAfterPublish, Logger: h.log,
			OnPublished: func(n int) { h.metrics.published.Add(float64(n)) },
			// What this host published is read now, not at the next poll.
			OnAdded: consumer.Wake,
		})
		if err != nil {
			return err
		}
		loops["relay"] = relay.Run
		rec, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: h.pool, StaleAfter: h.cfg.ReconcileAfter,
			Interval: h.cfg.ReconcileInterval, Logger: h.log})
		if err != nil {
			return err
		}
		loops["reconciler"] = rec.Run
	}
	if !h.cfg.DisableScheduler {
		sched, err := schedule.New(schedule.Config{Pool: h.pool, Logger: h.log})
		if err != nil {
			return err
		}
		loops["scheduler"] = sched.Run
	}
	trim, err := history.NewTrimmer(history.TrimmerConfig{Pool: h.pool, Retention: h.cfg.HistoryRetention, Logger: h.log})
	if err != nil {
		return err
	}
	loops["history-trim"] = trim.Run
	loops["swap-trim"] = h.trimSwaps
	ret, err := h.retainer()
	if err != nil {
		return err
	}
	loops["retention"] = ret.Run
	if h.watcher != nil {
		loops["plugin-watch"] = h.watcher.Run
	}
	if h.cfg.PluginDir != "" || len(h.cfg.Plugins) > 0 {
		loops["plugin-retry"] = h.retryRefused
	}
	pluginCtx, stopPlugins := context.WithCancel(context.WithoutCancel(ctx))
	var pwg sync.WaitGroup
	h.mu.Lock()
	h.runCtx = ctx
	h.pluginCtx, h.pluginWG = pluginCtx, &pwg
	for _, l := range h.plugins {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			l.sup.Run(pluginCtx)
		}()
	}
	h.mu.Unlock()
	var admin *http.Server
	if h.cfg.AdminAddr != "" {
		admin, err = h.serveAdmin()
		if err != nil {
			stopPlugins()
			return err
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, len(loops))
	for name, run := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	// The consumer has drained (or abandoned) in-flight jobs and the
	// watcher has stopped loading plugins; only now may the plugins stop.
	stopPlugins()
	h.mu.Lock()
	h.runCtx = nil
	h.pluginCtx, h.pluginWG = nil, nil
	h.mu.Unlock()
	pwg.Wait()
	if admin != nil {
		_ = admin.Close()
	}
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	h.log.Info("host stopped", "consumer", h.cfg.Consumer)
	return errors.Join(all...)
}

// Close releases the connections New opened. Call it after Run returns.
func (h *Host) Close() {
	h.mu.RLock()
	for _, l := range h.plugins {
		l.sup.Stop()
		l.db.Pool.Close()
	}
	h.mu.RUnlock()
	h.keepMu.Lock()
	if h.keepDir != "" {
		_ = os.RemoveAll(h.keepDir)
	}
	h.keepMu.Unlock()
	if h.ownRdb && h.rdb != nil {
		_ = h.rdb.Close()
	}
	if h.ownPool && h.pool != nil {
		h.pool.Close()
	}
}

// resolveAdminToken returns Config.AdminToken, else the token in
// AdminTokenFile (defaulted here), creating the file on first start.
func resolveAdminToken(cfg *Config) (string, error) {
	if cfg.AdminToken != "" {
		if err := admin.CheckToken(cfg.AdminToken); err != nil {
			return "", fmt.Errorf("host: AdminToken: %w", err)
		}
		cfg.Logger.Info("admin token from the configuration")
		return cfg.AdminToken, nil
	}
	if cfg.AdminTokenFile == "" {
		f, err := admin.DefaultTokenFile()
		if err != nil {
			return "", fmt.Errorf("host: %w", err)
		}
		cfg.AdminTokenFile = f
	}
	tok, created, err := admin.LoadOrCreateTokenFile(cfg.AdminTokenFile)
	if err != nil {
		return "", fmt.Errorf("host: %w", err)
	}
	if created {
		cfg.Logger.Info("admin token created", "file", cfg.AdminTokenFile)
	} else {
		cfg.Logger.Info("admin token read", "file", cfg.AdminTokenFile)
	}
	return tok, nil
}

// serveAdmin serves the admin API on AdminAddr behind admin.Guard: Host
// and Origin checked on every request, the token required on all but
// /healthz and the console (which asks for it on its login form).
func (h *Host) serveAdmin() (*http.Server, error) {
	ln, err := net.Listen("tcp", h.cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("host: admin listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(h.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /plugins", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h.PluginReport(r.Context()))
	})
	mux.HandleFunc("POST /plugins/reload", h.serveReload)
	mux.HandleFunc("POST /plugins/rollback", h.serveRollback)
	if err := h.serveConsole(mux); err != nil {
		_ = ln.Close()
		return nil, err
	}
	bound := ln.Addr().String()
	handler, err := admin.Guard(admin.GuardConfig{Token: h.adminToken, ListenAddr: h.cfg.AdminAddr, BoundAddr: bound,
		AllowedHosts: h.cfg.AdminAllowedHosts, OpenPaths: []string{"/healthz"}, SelfAuthPrefixes: []string{console.Prefix},
		Logger: h.log}, mux)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("host: admin API: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	h.mu.Lock()
	h.adminAddr = bound
	h.mu.Unlock()
	h.log.Info("admin listening", "addr", bound, "token_file", h.cfg.AdminTokenFile)
	if !admin.IsLoopback(bound) {
		h.log.Warn("the admin API listens on a non-loopback address: its token is the only protection, "+
			"and plain HTTP carries it in clear; keep it on 127.0.0.1 or terminate TLS in front of it",
			"addr", bound)
	}
	return srv, nil
}

// ReloadResponse is the admin API's answer to POST /plugins/reload.
type ReloadResponse struct {
	Results []ReloadResult `json:"results"`
	Error   string         `json:"error,omitempty"`
}

// serveReload is POST /plugins/reload?name=NAME: Reload, answered with a
// ReloadResponse (422 when the reload could not run). admin.Guard has
// checked the request's Host, Origin and token.
func (h *Host) serveReload(w http.ResponseWriter, r *http.Request) {
	// A swap, once asked for, completes even if the caller hangs up.
	res, err := h.Reload(context.WithoutCancel(r.Context()), r.URL.Query().Get("name"))
	resp := ReloadResponse{Results: res}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		resp.Error = err.Error()
		w.WriteHeader(http.StatusUnprocessableEntity)
	}
	_ = json.NewEncoder(w).Encode(resp)
}

// serveRollback is POST /plugins/rollback?name=NAME: Rollback, answered
// with a ReloadResponse of one result (422 when it could not roll back).
func (h *Host) serveRollback(w http.ResponseWriter, r *http.Request) {
	var resp ReloadResponse
	var res ReloadResult
	err := errors.New("host: name the plugin to roll back (?name=NAME)")
	if name := r.URL.Query().Get("name"); name != "" {
		res, err = h.Rollback(context.WithoutCancel(r.Context()), name)
	}
	if res.Action != "" {
		resp.Results = []ReloadResult{res}
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		resp.Error = err.Error()
		w.WriteHeader(http.StatusUnprocessableEntity)
	}
	_ = json.NewEncoder(w).Encode(resp)
}

// AdminAddr is the address the admin API listens on while Run runs
// (useful with AdminAddr ":0"); empty before.
func (h *Host) AdminAddr() string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.adminAddr
}

func guardName(g usherv1.Guard) string {
	switch g {
	case usherv1.Guard_GUARD_STATE_FIRST:
		return "state_first"
	case usherv1.Guard_GUARD_CLAIM:
		return "claim"
	case usherv1.Guard_GUARD_JOB_ID:
		return "job_id"
	}
	return "none"
}

// recordAbsorbed counts a duplicate a guard absorbed, in Prometheus and in
// Postgres (so `host inspect` sees every host's count).
func (h *Host) recordAbsorbed(g usherv1.Guard, kind, reason string) {
	h.metrics.absorbed.WithLabelValues(guardName(g), kind, reason).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.pool.Exec(ctx, `
		INSERT INTO absorbed_duplicates (guard, kind, reason, count) VALUES ($1, $2, $3, 1)
		ON CONFLICT (guard, kind, reason) DO UPDATE SET count = absorbed_duplicates.count + 1`,
		guardName(g), kind, reason); err != nil {
		h.log.Warn("count absorbed duplicate", "err", err)
	}
}

var propagator = propagation.TraceContext{}

// startSpan continues the job's trace (its W3C traceparent) in a span of its
// own and returns the traceparent the plugin should log with.
func (h *Host) startSpan(ctx context.Context, e stream.Entry) (context.Context, trace.Span, string) {
	if e.Trace != "" {
		ctx = propagator.Extract(ctx, propagation.MapCarrier{"traceparent": e.Trace})
	}
	ctx, span := h.tracer.Start(ctx, "usher.job "+e.Kind, trace.WithAttributes(
		attribute.String("usher.job_id", e.JobID), attribute.String("usher.kind", e.Kind),
		attribute.String("usher.stream_id", e.StreamID), attribute.Int("usher.attempt", e.Attempt)))
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	tp := carrier["traceparent"]
	if tp == "" {
		tp = e.Trace
	}
	return ctx, span, tp
}

// parkScript gives back the delivery of an entry its consumer still owns:
// XCLAIM to the same consumer with RETRYCOUNT set to the count before
// this delivery (ARGV[4] is the count the delivery was made with), and
// never higher than the count is now. The reclaimer may have claimed the
// entry again while this delivery waited for a slot or ran; the consumer
// skips such a claim (the entry is already running here), so it never
// reached a plugin either and is given back with it. JUSTID keeps XCLAIM
// from counting a delivery of its own.
var parkScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return -1 end
local n = math.min(math.max(tonumber(ARGV[4]) - 1, 0), tonumber(p[1][4]))
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', n, 'JUSTID')
return n`)

// giveBack runs parkScript: the delivery of e no longer counts towards
// MaxDeliveries. It returns the entry's delivery count after, and false
// (logged) when Redis could not be asked.
func (h *Host) giveBack(ctx context.Context, e stream.Entry) (int64, bool) {
	n, err := parkScript.Run(context.WithoutCancel(ctx), h.rdb, []string{h.cfg.Stream},
		h.cfg.Group, h.cfg.Consumer, e.StreamID, e.Deliveries).Int64()
	if err != nil {
		h.log.Warn("could not give back the delivery of a parked entry", "stream_id", e.StreamID, "job_id", e.JobID, "err", err)
		return 0, false
	}
	return n, true
}

// park leaves an entry pending without holding the delivery against it,
// when its plugin cannot take it: marked unhealthy (crash-looping), or
// crashed and not restarted yet.
//
// The host reads one stream for every kind, so an unhealthy plugin's
// entries are still read (and reclaimed every ReclaimIdle); what stops is
// running them. Each such delivery is given back in Redis (the entry's
// delivery count goes back to what it was before it), so MaxDeliveries
// counts only the deliveries that found a running plugin: an entry parked
// for an hour is not dead-lettered for it when a reload makes the plugin
// healthy again, and a poison entry that crashes the plugin at every run
// still reaches MaxDeliveries, one crash per count. After a reload the
// parked entries run when next reclaimed, within ReclaimIdle. If the give-back fails (Redis
// unreachable) the delivery counts, as it did before: the entry may reach
// MaxDeliveries early and be dead-lettered, never lost. A reclaimed entry
// whose count could not be read (e.Deliveries left at 1) is given back to
// 0: it loses its earlier count, the one way this errs towards running an
// entry more often.
func (h *Host) park(ctx context.Context, e stream.Entry, rt route, why string) {
	rt.parked.Add(1)
	n, ok := h.giveBack(ctx, e)
	if !ok {
		return
	}
	h.log.Debug("entry parked: "+why, "stream_id", e.StreamID, "job_id", e.JobID, "kind", e.Kind,
		"plugin", rt.plugin.Manifest().Name, "deliveries", n)
}

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
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/reclaim"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/migrations"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// route is where a kind's jobs go.
type route struct {
	plugin *pluginhost.Supervisor
	guard  usherv1.Guard
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

	mu      sync.RWMutex
	routes  map[string]route
	plugins map[string]*pluginhost.Supervisor
	paths   map[string]string // plugin name -> binary path

	consumer *stream.Consumer
}

// New connects to Postgres and Redis, applies migrations, and starts the
// plugins. Nothing is read from the stream until Run.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h := &Host{cfg: cfg, log: cfg.Logger, pool: cfg.Pool, rdb: cfg.Redis, metrics: newMetrics(),
		tracer: otel.Tracer("github.com/usherhq/usher/host"),
		routes: map[string]route{}, plugins: map[string]*pluginhost.Supervisor{}, paths: map[string]string{}}
	if h.pool == nil {
		pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("host: postgres: %w", err)
		}
		h.pool, h.ownPool = pool, true
	}
	if h.rdb == nil {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("host: redis url: %w", err)
		}
		h.rdb, h.ownRdb = redis.NewClient(opt), true
	}
	if err := h.pool.Ping(ctx); err != nil {
		h.Close()
		return nil, fmt.Errorf("host: postgres unreachable: %w", err)
	}
	if err := h.rdb.Ping(ctx).Err(); err != nil {
		h.Close()
		return nil, fmt.Errorf("host: redis unreachable: %w", err)
	}
	if err := migrations.Up(ctx, h.pool); err != nil {
		h.Close()
		return nil, err
	}
	h.handles = guard.NewHandles(h.pool, h.log)
	runner, err := guard.NewRunner(guard.Config{
		Pool: h.pool, Handles: h.handles, StatementTimeout: cfg.StatementTimeout,
		TransientBackoff: cfg.RetryBackoff, OnAbsorbed: h.recordAbsorbed, Logger: h.log,
	})
	if err != nil {
		h.Close()
		return nil, err
	}
	h.runner = runner
	paths, err := h.pluginPaths()
	if err != nil {
		h.Close()
		return nil, err
	}
	for _, p := range paths {
		if err := h.LoadPlugin(ctx, p); err != nil {
			h.Close()
			return nil, err
		}
	}
	h.log.Info("host ready", "config", cfg, "kinds", h.Kinds())
	return h, nil
}

func (h *Host) pluginPaths() ([]string, error) {
	paths := append([]string{}, h.cfg.Plugins...)
	if h.cfg.PluginDir == "" {
		return paths, nil
	}
	entries, err := os.ReadDir(h.cfg.PluginDir)
	if err != nil {
		return nil, fmt.Errorf("host: plugin dir: %w", err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || e.IsDir() || info.Mode()&0o111 == 0 {
			continue
		}
		paths = append(paths, filepath.Join(h.cfg.PluginDir, e.Name()))
	}
	return paths, nil
}

// LoadPlugin starts the plugin binary at path and routes its kinds to it. It
// refuses a plugin that declares a kind without a guard, or a kind another
// loaded plugin already serves.
func (h *Host) LoadPlugin(ctx context.Context, path string) error {
	sup, err := pluginhost.NewSupervisor(ctx, pluginhost.SupervisorConfig{
		Plugin: pluginhost.Config{Path: path, Host: h.handles, Logger: h.log, Env: h.cfg.PluginEnv},
		OnRestart: func(m pluginhost.Manifest, pid int) {
			h.metrics.restarts.WithLabelValues(m.Name).Inc()
		},
	})
	if err != nil {
		return fmt.Errorf("host: load plugin %s: %w", path, err)
	}
	m := sup.Manifest()
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.plugins[m.Name]; dup {
		sup.Stop()
		return fmt.Errorf("host: plugin %s is already loaded", m.Name)
	}
	for _, k := range m.Kinds {
		if r, taken := h.routes[k.Kind]; taken {
			sup.Stop()
			return fmt.Errorf("host: plugin %s declares kind %q, already served by %s", m.Name, k.Kind, r.plugin.Manifest().Name)
		}
	}
	for _, k := range m.Kinds {
		h.routes[k.Kind] = route{plugin: sup, guard: k.Guard}
	}
	h.plugins[m.Name] = sup
	h.paths[m.Name] = path
	h.log.Info("plugin loaded", "plugin", m.Name, "version", m.Version, "pid", sup.Pid(), "kinds", len(m.Kinds))
	return nil
}

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
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	Path     string   `json:"path"`
	Pid      int      `json:"pid"`
	Healthy  bool     `json:"healthy"`
	Restarts int      `json:"restarts"`
	Kinds    []string `json:"kinds"`
}

// Plugins reports the loaded plugins.
func (h *Host) Plugins() []PluginStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []PluginStatus
	for name, sup := range h.plugins {
		m := sup.Manifest()
		st := PluginStatus{Name: name, Version: m.Version, Path: h.paths[name], Pid: sup.Pid(), Healthy: sup.Healthy(), Restarts: sup.Restarts()}
		for _, k := range m.Kinds {
			st.Kinds = append(st.Kinds, k.Kind+" ("+guardName(k.Guard)+")")
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Swap replaces the named plugin with the binary at path while jobs keep
// flowing; see pluginhost.Supervisor.Swap.
func (h *Host) Swap(ctx context.Context, name, path string) (pluginhost.SwapResult, error) {
	h.mu.RLock()
	sup := h.plugins[name]
	h.mu.RUnlock()
	if sup == nil {
		return pluginhost.SwapResult{}, fmt.Errorf("host: no plugin %q is loaded", name)
	}
	res, err := sup.Swap(ctx, pluginhost.Config{Path: path, Host: h.handles, Logger: h.log, Env: h.cfg.PluginEnv})
	if err != nil {
		return res, err
	}
	h.mu.Lock()
	h.paths[name] = path
	h.mu.Unlock()
	h.log.Info("plugin swapped", "plugin", name, "from", res.From.Version, "to", res.To.Version,
		"drained", res.Drained, "drain_time", res.DrainTime)
	return res, nil
}

// Pool returns the host's Postgres pool.
func (h *Host) Pool() *pgxpool.Pool { return h.pool }

// Redis returns the host's Redis client.
func (h *Host) Redis() redis.UniversalClient { return h.rdb }

// Run serves until ctx is done, then stops reading, gives in-flight jobs a
// grace period (those that do not finish stay unacked and are reclaimed),
// stops the plugins and returns.
func (h *Host) Run(ctx context.Context) error {
	var err error
	h.consumer, err = stream.NewConsumer(stream.ConsumerConfig{
		Redis: h.rdb, Stream: h.cfg.Stream, Group: h.cfg.Group, Name: h.cfg.Consumer,
		Concurrency: h.cfg.Concurrency, Dispatch: h.dispatch, ShutdownGrace: h.cfg.ShutdownGrace, Logger: h.log,
	})
	if err != nil {
		return err
	}
	if err := stream.EnsureGroup(ctx, h.rdb, h.cfg.Stream, h.cfg.Group); err != nil {
		return err
	}
	rec, err := reclaim.New(reclaim.Config{
		Redis: h.rdb, Stream: h.cfg.Stream, Group: h.cfg.Group, Consumer: h.cfg.Consumer,
		MinIdle: h.cfg.ReclaimIdle, Interval: h.cfg.ReclaimInterval, Submit: h.consumer.Submit,
		OnReclaimed: func(n int) { h.metrics.reclaimed.Add(float64(n)) }, Logger: h.log,
	})
	if err != nil {
		return err
	}
	loops := map[string]func(context.Context) error{"consumer": h.consumer.Run, "reclaim": rec.Run}
	if !h.cfg.DisableRelay {
		relay, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: h.pool, Redis: h.rdb, Stream: h.cfg.Stream, PollInterval: h.cfg.RelayPollInterval,
			AfterPublish: h.cfg.RelayAfterPublish, Logger: h.log,
			OnPublished: func(n int) { h.metrics.published.Add(float64(n)) },
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
	pluginCtx, stopPlugins := context.WithCancel(context.WithoutCancel(ctx))
	var pwg sync.WaitGroup
	h.mu.RLock()
	for _, sup := range h.plugins {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			sup.Run(pluginCtx)
		}()
	}
	h.mu.RUnlock()
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
	// The consumer has drained (or abandoned) in-flight jobs; only now may
	// the plugins stop.
	stopPlugins()
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
	for _, sup := range h.plugins {
		sup.Stop()
	}
	h.mu.RUnlock()
	if h.ownRdb && h.rdb != nil {
		_ = h.rdb.Close()
	}
	if h.ownPool && h.pool != nil {
		h.pool.Close()
	}
}

func (h *Host) serveAdmin() (*http.Server, error) {
	ln, err := net.Listen("tcp", h.cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("host: admin listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(h.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/plugins", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h.Plugins())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	h.log.Info("admin listening", "addr", ln.Addr().String())
	return srv, nil
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

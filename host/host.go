// Package host is the usher runtime as a library: build a Host from a
// Config, run it under your context, and it owns the stream consumer, the
// reclaim loop, the outbox relay, the scheduler, dead letters, every
// transaction boundary, and the handler plugins it starts as separate
// processes. cmd/host is a thin binary over it.
//
// Host is the composition root: it builds the services (host/internal/...:
// the job pipeline, settlement, the plugin fleet, the stream, the
// background loops, the admin API, telemetry) from the Config, runs them
// in phases and stops them in reverse; it does no job's work itself.
package host

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/internal/adminapi"
	"github.com/usherhq/usher/host/internal/fleet"
	"github.com/usherhq/usher/host/internal/pipeline"
	"github.com/usherhq/usher/host/internal/settle"
	"github.com/usherhq/usher/host/internal/telemetry"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/limits"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/host/workflow"
	"github.com/usherhq/usher/migrations"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Host is a running usher runtime.
type Host struct {
	cfg     Config
	log     *slog.Logger
	pool    *pgxpool.Pool
	ownPool bool
	rdb     redis.UniversalClient
	// shards are the stream's shards this host reads (ops.RecordShards);
	// keys are their priority bands (stream.Keys), where entries wait.
	shards  []string
	keys    []string
	ownRdb  bool
	metrics *telemetry.Metrics
	// key signs and verifies stream entries (Config.SigningKey).
	key []byte
	// adminToken is the admin API's resolved token (Config.AdminToken or
	// the file's); set by New when AdminAddr is set.
	adminToken string

	fleet        *fleet.Fleet
	decider      *workflow.Decider
	consumer     *stream.Consumer
	redispatcher *stream.Redispatcher
	pipeline     *pipeline.Pipeline
	pauses       *pause.Watcher
	cancels      *jobctl.CancelWatcher
	limits       *limits.Limiter
	admin        *adminapi.Server
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
	h := &Host{adminToken: adminToken, cfg: cfg, log: cfg.Logger, pool: cfg.Pool, rdb: cfg.Redis, metrics: telemetry.NewMetrics()}
	if w := cfg.reconcileWarning(); w != "" {
		h.log.Warn("dangerous setting: " + w)
	}
	schema, err := h.connect(ctx)
	if err != nil {
		h.Close()
		return nil, err
	}
	if err := h.build(ctx, schema); err != nil {
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

// connect opens (or takes) the pool and the Redis client, checks the
// host's login, applies the migrations and loads the signing key. It
// returns the runtime's schema (the host login's current_schema()).
func (h *Host) connect(ctx context.Context) (string, error) {
	cfg := h.cfg
	if h.pool == nil {
		pool, err := newHostPool(ctx, cfg)
		if err != nil {
			return "", fmt.Errorf("host: postgres: %w", err)
		}
		h.pool, h.ownPool = pool, true
	}
	if h.rdb == nil {
		rdb, err := NewRedisClient(cfg.RedisURL, cfg.RedisCAFile)
		if err != nil {
			return "", fmt.Errorf("host: %w", err)
		}
		h.rdb, h.ownRdb = rdb, true
	}
	if err := h.pool.Ping(ctx); err != nil {
		return "", postgresError(err)
	}
	if err := h.rdb.Ping(ctx).Err(); err != nil {
		return "", fmt.Errorf("host: redis unreachable: %w", err)
	}
	user, schema, err := sandbox.CheckHostLogin(ctx, h.pool, cfg.AllowSuperuser)
	if err != nil {
		return "", fmt.Errorf("host: %w", err)
	}
	if user != "" && cfg.AllowSuperuser {
		h.log.Warn("the host's database login may be a superuser (AllowSuperuser): one escape from a plugin's role is the whole cluster", "user", user)
	}
	if err := migrations.Up(ctx, h.pool); err != nil {
		return "", err
	}
	n, err := ops.RecordShards(ctx, h.pool, cfg.Stream, cfg.StreamShards)
	if err != nil {
		return "", fmt.Errorf("host: %w", err)
	}
	h.shards, h.keys = stream.ShardKeys(cfg.Stream, n), stream.Keys(cfg.Stream, n)
	if n > cfg.StreamShards {
		h.log.Info("reading more shards than this host publishes to: a host was started with more; their entries are read until the shards are empty",
			"publishes_to", cfg.StreamShards, "reads", n)
	}
	h.key = cfg.SigningKey
	if h.key == nil {
		if h.key, err = outbox.LoadSigningKey(ctx, h.pool); err != nil {
			return "", fmt.Errorf("host: %w", err)
		}
		h.log.Info("stream signing key loaded from the database (runtime_secrets)")
	} else {
		h.log.Info("stream signing key taken from the configuration")
	}
	return schema, nil
}

// build makes the services: the guard runner and settlement, the plugin
// fleet (which loads the plugins), the stream's consumer and redispatcher,
// the pipeline between them, and the admin API.
func (h *Host) build(ctx context.Context, schema string) error {
	cfg := h.cfg
	settler, err := settle.New(settle.Config{Pool: h.pool, Consumer: cfg.Consumer, Logger: h.log})
	if err != nil {
		return err
	}
	h.consumer, err = stream.NewConsumer(stream.ConsumerConfig{
		Redis: h.rdb, Streams: h.shards, Group: cfg.Group, Name: cfg.Consumer,
		Concurrency: cfg.Concurrency, MaxBytes: cfg.MaxEntryBytesHeld, IdlePoll: cfg.IdlePoll,
		Dispatch: h.dispatch, ShutdownGrace: cfg.ShutdownGrace, Logger: h.log,
	})
	if err != nil {
		return err
	}
	h.metrics.EntryBytes(h.consumer.BytesHeld)
	h.metrics.KindWait(h.pool, h.log)
	handles := guard.NewHandles(schema, h.log)
	runner, err := guard.NewRunner(guard.Config{
		Handles: handles, StatementTimeout: cfg.StatementTimeout, TransientBackoff: cfg.RetryBackoff, Logger: h.log,
		OnAbsorbed: func(g usherv1.Guard, kind, reason string) {
			h.metrics.Absorbed.WithLabelValues(telemetry.GuardName(g), kind, reason).Inc()
			settler.Absorbed(telemetry.GuardName(g), kind, reason)
		},
		BatchMax: cfg.BatchMax, Solo: pluginhost.IsAlone, StalledAfter: cfg.StalledAfter, Arriving: h.consumer.Arriving, GatherWait: cfg.BatchWait,
		OnBatch: h.metrics.ObserveBatch,
	})
	if err != nil {
		return err
	}
	// The fleet is built below; the versions workflows are pinned to are
	// its own, asked once it runs.
	pinned := workflow.VersionsFunc(func(plugin, version string) (guard.Invoker, error) { return h.fleet.Pinned(plugin, version) })
	decider, err := workflow.NewDecider(workflow.Config{Pool: h.pool, Backoff: runner.Backoff, Versions: pinned, Logger: h.log})
	if err != nil {
		return err
	}
	h.decider = decider
	// Decision tasks run through the same pipeline as jobs; the workflow
	// runner answers the kinds served under the workflow guard.
	jobs := workflow.Runner{Guards: runner, Decider: decider, OnAbsorbed: func(g usherv1.Guard, kind, reason string) {
		h.metrics.Absorbed.WithLabelValues(telemetry.GuardName(g), kind, reason).Inc()
		settler.Absorbed(telemetry.GuardName(g), kind, reason)
	}}
	h.fleet, err = fleet.New(ctx, fleet.Config{
		Pool: h.pool, Handles: handles, Schema: schema, Consumer: cfg.Consumer,
		Plugins: cfg.Plugins, Dir: cfg.PluginDir, DisableWatch: cfg.DisablePluginWatch, PollInterval: cfg.PluginPollInterval,
		Env: cfg.PluginEnv, User: cfg.PluginUser,
		CrashLoop: cfg.PluginCrashLoop, CrashWindow: cfg.PluginCrashWindow, UnhealthyRetry: cfg.PluginUnhealthyRetry, DrainTimeout: cfg.PluginDrainTimeout,
		PoolSize: cfg.PluginPoolSize, StatementTimeout: cfg.StatementTimeout,
		LockTimeout: cfg.LockTimeout, IdleInTransactionTimeout: cfg.IdleInTransactionTimeout,
		RollbackWindow: cfg.RollbackWindow, RollbackMinJobs: cfg.RollbackMinJobs, RollbackFailureShare: cfg.RollbackFailureShare,
		// A parked entry is read again, here or by another host's
		// reclaimer, within the reclaim threshold and a scan.
		ParkedFor:     2*cfg.ReclaimIdle + cfg.ReclaimInterval,
		RetryInterval: cfg.PluginRetryInterval, Metrics: h.metrics, Logger: h.log,
	})
	if err != nil {
		return err
	}
	h.pauses, err = pause.NewWatcher(pause.WatcherConfig{Pool: h.pool, Interval: cfg.PausePollInterval, Logger: h.log})
	if err != nil {
		return err
	}
	h.cancels, err = jobctl.NewCancelWatcher(jobctl.CancelWatcherConfig{Pool: h.pool, Interval: cfg.PausePollInterval, Logger: h.log})
	if err != nil {
		return err
	}
	h.limits, err = limits.New(limits.Config{Pool: h.pool, Redis: h.rdb, Stream: cfg.Stream, Holder: cfg.Consumer,
		Interval: cfg.PausePollInterval, Logger: h.log})
	if err != nil {
		return err
	}
	pending := stream.Pending{Redis: h.rdb, Group: cfg.Group, Consumer: cfg.Consumer}
	var ready func(string) bool // the pipeline's, set below: the redispatcher is built first
	h.redispatcher, err = stream.NewRedispatcher(stream.RedispatcherConfig{Pending: pending, Take: h.consumer.Take,
		Ready: func(kind string) bool { return ready(kind) }, GiveUpAfter: cfg.ReclaimIdle, Logger: h.log})
	if err != nil {
		return err
	}
	h.pipeline, err = pipeline.New(pipeline.Config{
		Consumer: cfg.Consumer, Key: h.key,
		MaxDeliveries: cfg.MaxDeliveries, MaxAttempts: cfg.MaxAttempts, PoisonCrashes: cfg.PoisonCrashes, Concurrency: cfg.Concurrency,
		JobTimeout: cfg.JobTimeout, StalledAfter: cfg.StalledAfter, UnknownKindWait: cfg.UnknownKindWait,
		Routes: h.fleet.Routes(), Fleet: h.fleet, Pending: pending, Redelivery: h.redispatcher, Settler: settler, Runner: jobs,
		Paused: h.pauses.Paused, Cancelled: h.cancels.Cancelled, Limits: h.limits, Detach: h.consumer.Detach,
		Start: jobctl.NewStarter(h.pool).Start, Metrics: h.metrics, Tracer: telemetry.NewTracer(), Logger: h.log,
	})
	if err != nil {
		return err
	}
	ready = h.pipeline.Ready
	if cfg.AdminAddr != "" {
		h.admin, err = adminapi.New(adminapi.Config{
			Addr: cfg.AdminAddr, Token: h.adminToken, TokenFile: cfg.AdminTokenFile, AllowedHosts: cfg.AdminAllowedHosts,
			Registry: h.metrics.Reg, Fleet: h.fleet, Pool: h.pool, Redis: h.rdb, Stream: cfg.Stream, Group: cfg.Group, Shards: h.shards,
			ChartWindow: cfg.ConsoleChartWindow, ChartBucket: cfg.ConsoleChartBucket, HistoryRetention: cfg.HistoryRetention, MigrateWorkflows: h.MigrateWorkflows,
			Logger: h.log,
		})
		if err != nil {
			return fmt.Errorf("host: %w", err)
		}
	}
	return nil
}

// dispatch is the consumer's Dispatch: the pipeline's.
func (h *Host) dispatch(ctx context.Context, e stream.Entry) bool { return h.pipeline.Dispatch(ctx, e) }

// Close releases what New opened: the plugins' processes and pools, the
// kept binaries, and the connections New opened. Call it after Run
// returns (or instead of Run).
func (h *Host) Close() {
	if h.fleet != nil {
		h.fleet.Close()
	}
	if h.admin != nil {
		h.admin.Close() // a listener Run never served on
	}
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

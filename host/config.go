package host

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/secretfile"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/contract"
	"github.com/usherhq/usher/internal/entry"
)

// Config is everything a Host needs. Every field says its default; New fills
// the defaults in one place and validates the result.
type Config struct {
	// DatabaseURL is the Postgres connection string. Required unless Pool
	// is set.
	DatabaseURL string
	// Pool is an existing pgx pool (an embedding application's). Optional.
	Pool *pgxpool.Pool
	// RedisURL is the Redis connection string. Required unless Redis is set.
	RedisURL string
	// Redis is an existing client. Optional.
	Redis redis.UniversalClient
	// RedisCAFile is a PEM file of the CA certificates that sign the Redis
	// server's certificate, for a rediss:// RedisURL (TLS): when set they
	// are the only roots trusted for Redis. Default: the system's roots.
	// Setting it with a redis:// URL is an error (it would not be used).
	RedisCAFile string

	// SigningKey is the key the relay signs every stream entry with
	// (HMAC-SHA256) and the consumer verifies it by before dispatch: an
	// entry that does not verify is dead-lettered as forged. Every host of
	// a cluster must have the same key; at least 32 bytes. Default: the
	// key in the database's runtime_secrets table, which the first host to
	// start generates (32 random bytes).
	SigningKey []byte

	// Stream is the stream key. Default "usher:{jobs}" (the hash tag keeps
	// a partition's keys in one Redis Cluster slot).
	Stream string
	// StreamShards is how many shards the stream is split into: the relay
	// adds each job's entries to one (stream.ShardOf, by job identity),
	// shard i > 0 keyed as stream.ShardKey says (usher:{jobs-1}, ...) so
	// that a Redis Cluster spreads them over its primaries. The host reads
	// every shard up to the most any host has been started with (recorded
	// in the stream_shards table), so lowering it strands nothing.
	// Default 1: the stream key alone, as before shards.
	StreamShards int
	// Group is the consumer group. Default "usher".
	Group string
	// Consumer is this host's name in the group; unique per process.
	// Default "<hostname>-<pid>".
	Consumer string

	// PluginDir holds the plugins: each is a binary plus a manifest file
	// <name>.plugin.json naming it, with the plugin's name, version and the
	// binary's SHA-256 (`host plugins manifest` writes one). The checksum
	// is verified before the binary starts, and the running plugin must
	// report the manifest's name and version. Each plugin is installed
	// before it serves, as `host plugins install` does (host/plugindb: its
	// migrations in its schema plugin_<name>, its declared grants); a
	// refused install refuses the plugin. An executable no manifest
	// names is ignored with a warning. A manifest that cannot be loaded,
	// at New or later while Run watches the directory, is logged and left
	// out (Host.Refusals lists those refused at New): no single plugin
	// stops the host, and a running version keeps serving. Only a
	// directory that cannot be read is New's error. Optional.
	PluginDir string
	// DisablePluginWatch turns off the watch of PluginDir: manifests are
	// then re-read only by Reload (`host plugins reload`). Default: Run
	// watches the directory (fsnotify, and a poll as the fallback) and
	// reloads what changed.
	DisablePluginWatch bool
	// PluginPollInterval is how often PluginDir is compared with what was
	// last seen, besides fsnotify's events. Default 2s.
	PluginPollInterval time.Duration
	// PluginRetryInterval is how often a manifest refused for a reason
	// that was not the plugin's (the database unreachable or restarting
	// while it loaded) is tried again. Default 5s.
	PluginRetryInterval time.Duration
	// Plugins lists plugin binaries to start besides PluginDir's, with no
	// manifest: no checksum is verified, nothing is installed (their
	// schema and grants must be in place) and Reload does not touch them
	// (unless a manifest in PluginDir names the same plugin, which then
	// replaces it). For tests and embedding applications.
	Plugins []string
	// PluginEnv is every plugin's environment (e.g. the mail provider's
	// address), besides the few variables a process needs (PATH, HOME,
	// LANG, TZ, TMPDIR, ...: pluginhost.Environ). Nothing else of the
	// host's environment reaches a plugin: not its database or Redis URL,
	// its admin token, or PGPASSFILE.
	PluginEnv []string
	// PluginUser, when set, is the OS user plugin processes run as (the
	// host must run as root to switch). Use it where plugins are untrusted:
	// a plugin running as the host's own user can read whatever the host
	// can, its passfile, admin token and signing key files included.
	// "{name}" in it stands for each plugin's name
	// (pluginhost.DefaultUserPattern, "usher-p-{name}"): each plugin then
	// runs as its own user and cannot signal, ptrace or read the /proc of
	// another plugin either; one name for all lets them kill each other.
	// Default: the host's user.
	PluginUser string

	// AllowSuperuser lets the host run on a superuser login. Default
	// false: New refuses one, since plugins run untrusted code and a
	// superuser host turns one escape from a plugin's role into the whole
	// cluster. The host needs only the runtime's owner role (`host setup`).
	AllowSuperuser bool
	// PluginPoolSize is how many Postgres connections each plugin's pool
	// holds at most. A plugin's statements run only on its own pool,
	// logged in as its role (usher_plugin_<name>), so a plugin that stalls
	// exhausts only its own connections. Default 4 (at most Concurrency):
	// what the batcher needs, two for its batches (one sending its writes
	// while the one before it commits, see host/guard) and two for what
	// runs beside them (read-only checks, state-first commits, claims, a
	// split batch's jobs run alone). Every host holds at most
	// ConnectionBudget connections, logged at start.
	PluginPoolSize int
	// LockTimeout is the lock_timeout of every plugin session: a plugin's
	// statement that waits longer on a lock (another host's batch holding
	// the row) fails, and its job is retried. Default 5s.
	LockTimeout time.Duration
	// IdleInTransactionTimeout is the idle_in_transaction_session_timeout
	// of every session the host opens, its own pool's and the plugins':
	// the server ends a session left inside a transaction, sending
	// nothing, that long, so a host frozen with a batch open (SIGSTOP)
	// does not hold its row locks for ever over the host that reclaimed
	// its entries (with Pool set, the application's pool keeps its own
	// settings). Must exceed JobTimeout. Default JobTimeout + 10s.
	IdleInTransactionTimeout time.Duration
	// PluginCrashLoop crashes within PluginCrashWindow mark a plugin
	// unhealthy: its entries wait in the stream until it is restarted on
	// probation PluginUnhealthyRetry later (twice as long after each
	// relapse, up to 10 minutes) or a reload starts a working version.
	// Defaults 5, 1 minute and 30s.
	PluginCrashLoop      int
	PluginCrashWindow    time.Duration
	PluginUnhealthyRetry time.Duration
	// PoisonCrashes: an entry that was in flight when its plugin's process
	// crashed this many times is dead-lettered as poison, so the plugin's
	// other jobs go on. After its first crash an entry runs alone on the
	// plugin (no other call in flight), so an innocent entry caught in
	// another's crash is charged once and then cleared. The count is kept
	// in Redis per stream entry (shared by every host, expiring a day
	// after the last crash). Default 3.
	PoisonCrashes int
	// PluginDrainTimeout bounds how long a swap waits for the old
	// version's in-flight calls; those that overrun are left unacked and
	// reclaimed. Default 30s.
	PluginDrainTimeout time.Duration
	// RollbackWindow is how long a version swapped in is on probation:
	// the version it replaced stays restartable, and if the new one
	// crash-loops (PluginCrashLoop), or RollbackFailureShare of its jobs
	// fail with errors once it has run RollbackMinJobs (crashes,
	// abandoned runs and transient errors count; a job's own permanent
	// failure and a retry its handler asked for do not), the host swaps
	// back by itself and refuses the manifest it rolled back from until
	// that changes. Defaults 60s, 0.5 and 10; a negative window turns
	// automatic rollback off (plugins rollback still works).
	RollbackWindow       time.Duration
	RollbackFailureShare float64
	RollbackMinJobs      int

	// Concurrency bounds the jobs in flight in this host. Default 16.
	Concurrency int
	// StalledAfter is how long a job runs before it counts as stalled. A
	// stalled job gives its slot back (up to Concurrency of them at
	// once), so the consumer reads on; and a plugin with Concurrency/2
	// stalled jobs gets no more: its further entries are parked and run
	// as its stalled jobs end. A plugin that hangs thus slows only
	// itself, and the other plugins' jobs keep flowing. Default 2s.
	StalledAfter time.Duration
	// BatchMax is the most jobs of one plugin whose guard records the job
	// id that run in one transaction, with one call to the plugin: the
	// jobs waiting when a batch starts, after BatchWait at most for those
	// on their way. A batch that cannot apply whole runs each of its jobs
	// again alone, so the more jobs a batch has, the likelier one failing
	// job costs all of them a second run: a plugin whose jobs often fail
	// wants fewer. A batch also stops at 8 MiB of jobs (half the gRPC
	// message cap). Default 128: at 256 jobs in flight a host committed
	// 9,300-10,700 counter jobs/s with it against 6,800-7,500 with 32
	// (docs/benchmarks.md); below a plugin's rate the batches stay as
	// small as the jobs waiting. 1 runs every job in its own transaction.
	BatchMax int
	// BatchWait bounds how long a batch about to start waits for the jobs
	// on their way to it: read from the stream and not yet queued, and,
	// after a batch is over, as many as it had (guard.Config.GatherWait).
	// Default 2ms, a few of this machine's Redis round trips; a host far
	// from its Redis wants more. Negative: no wait, a batch takes the jobs
	// queued when it starts.
	BatchWait time.Duration
	// MaxEntryBytesHeld bounds the memory this host's stream entries take:
	// room for an entry (1 MiB, the largest it runs) is reserved before
	// it is read, and an entry holds its size until it is finished; the
	// reader reads no more while the budget is spent. An entry over 1 MiB
	// is never read whole: Redis cuts it to a prefix of each field (see
	// host/stream's readScript) and it is dead-lettered. Default 64 MiB;
	// at least 1 MiB.
	MaxEntryBytesHeld int64
	// IdlePoll is the longest wait between two stream reads that found
	// nothing (the read is a script, and Redis refuses to block in one).
	// Default 200ms.
	IdlePoll time.Duration
	// UnknownKindWait is how long an entry whose kind no plugin of this
	// host serves waits for a host that does (a rolling deploy of a new
	// kind): it stays pending, its deliveries not counted towards
	// MaxDeliveries, and the reclaimer of any host hands it on every
	// ReclaimIdle, so a host serving the kind runs it within ReclaimIdle
	// of starting. An entry older than this (its stream id's timestamp) is
	// dead-lettered as bad_input, its reason naming the wait. Waiting
	// entries show in `host inspect` and usher_jobs_waiting_for_kind.
	// Default 1h; negative: dead-lettered at once.
	UnknownKindWait time.Duration
	// ReclaimIdle is the reclaim threshold. Default 60s.
	ReclaimIdle time.Duration
	// ReclaimInterval is how often the reclaimer scans. Default
	// ReclaimIdle/4.
	ReclaimInterval time.Duration
	// HostLeaseTTL is the host's heartbeat lease in Redis (renewed every
	// TTL/3): the pending entries of a host whose lease expired and that
	// stopped reading are claimed by the others at once, instead of after
	// ReclaimIdle, which stays for a host that is alive but slow (see
	// stream.Lease). Default 5s; negative: no lease and no such claims.
	HostLeaseTTL time.Duration
	// JobTimeout bounds one run of a handler; an overrun is cancelled, its
	// transaction rolled back, and the job retried. Default 30s.
	JobTimeout time.Duration
	// MaxDeliveries: an entry delivered more often is dead-lettered.
	// Default 10.
	MaxDeliveries int64
	// MaxAttempts: a job retried this often is dead-lettered, whether its
	// handler failed or asked to run later (sdk.RetryLater, whose delay
	// the host keeps within guard.MinRetryLater and MaxRetryLater, 100ms
	// to 24h): a job that asks to run later for ever ends as a dead
	// letter with the reason. Default 8.
	MaxAttempts int
	// StatementTimeout bounds each statement in a host transaction.
	// Default 10s.
	StatementTimeout time.Duration
	// RetryBackoff is the first delay after a transient failure, doubled
	// per attempt. Default 1s.
	RetryBackoff time.Duration
	// ShutdownGrace is how long Run waits for in-flight jobs once its
	// context is done; jobs still running then are cancelled, their
	// transactions rolled back, and their entries left unacked for another
	// host to reclaim. Default 10s.
	ShutdownGrace time.Duration

	// DisableRelay and DisableScheduler turn off this host's outbox relay
	// and scheduler (another process runs them). Default: both run.
	DisableRelay     bool
	DisableScheduler bool
	// RelayPollInterval is the relay's fallback poll. Default 1s.
	RelayPollInterval time.Duration
	// RelayReplicas: the relay marks a row published only once this many
	// Redis replicas acknowledged its entry (WAIT, 1s timeout; a batch
	// short of them goes out again). Default 0: not waited for.
	RelayReplicas int
	// An outbox row whose job has no outcome and that was published
	// before every entry still on the stream has lost its entry (Redis
	// lost it): the reconciler publishes it again once it is
	// IdleInTransactionTimeout + 5s older than the oldest entry still
	// pending or undelivered, a window read from the stream at each scan
	// (outbox.Reconciler). ReconcileAfter is its ceiling: a row published
	// this long ago is published again even when an older entry is still
	// pending (a paused kind's), though never while an older one is still
	// undelivered, so a backlog republishes nothing. Default 15 minutes.
	ReconcileAfter time.Duration
	// ReconcileInterval is how often the reconciler scans. Default 10s.
	ReconcileInterval time.Duration
	// PausePollInterval is how often this host reads the kinds an operator
	// paused (host/pause), the kinds' limits (host/limits) and the cancels
	// of jobs on the stream (host/jobctl, which also hears them at once by
	// LISTEN/NOTIFY): a pause, resume, limit change or cancel reaches it
	// within this. Default 1s.
	PausePollInterval time.Duration
	// HistoryRetention is how long a job's history records (one per
	// delivery, see host/history) and the plugins' swap history are kept;
	// each host's retainer deletes older ones every CleanupInterval.
	// Default 7 days.
	HistoryRetention time.Duration
	// WorkflowRetention is how long a finished workflow (completed,
	// failed or cancelled) is kept, with its history; running ones are
	// never deleted. 0: kept for ever (the default). At least the
	// redelivery bound, like OutboxRetention.
	WorkflowRetention time.Duration
	// StreamTrimInterval is how often the stream is trimmed behind the
	// oldest entry any consumer group still owes (pending, or not yet
	// delivered): never past it, by a Lua script any number of hosts may
	// run at once. Default 5s; negative: this host never trims.
	StreamTrimInterval time.Duration
	// CleanupInterval is how often this host removes gone consumers and
	// applies the retention windows below. Default 1m.
	CleanupInterval time.Duration
	// ConsumerIdleRemove: a consumer of Group with nothing pending that
	// has been idle this long belongs to a host gone for good and is
	// removed (a live one is created again by its next read). Default
	// 24h; negative: consumers are never removed.
	ConsumerIdleRemove time.Duration
	// ProcessedJobsRetention, OutboxRetention and DeadLetterRetention are
	// how long processed job ids (guard 4), done outbox rows (with the
	// delayed runs moved to the outbox) and dead letters are kept. 0 (the
	// default): for ever. A window set must be at least RetentionBound(),
	// the longest a job can still come back, or New refuses it; and a row
	// is deleted only when nothing could still bring its job back (see
	// host/retention).
	ProcessedJobsRetention time.Duration
	OutboxRetention        time.Duration
	DeadLetterRetention    time.Duration
	// RetentionMargin is how much older than the oldest entry the stream
	// still owes a row must be to be deleted: it covers the clocks of
	// Redis and Postgres drifting apart. Default 5 minutes.
	RetentionMargin time.Duration
	// RelayAfterPublish is a fault hook for tests and the demo: an error
	// aborts a published batch before it is marked, as a crash would.
	RelayAfterPublish func(ids []int64) error

	// AdminAddr serves the admin API: /metrics, /healthz, /plugins and
	// POST /plugins/reload. Empty: off (and no token is resolved).
	// cmd/host's default is 127.0.0.1:9464; an address that is not a
	// loopback one is served with a warning: the token is then the only
	// protection and travels in clear, so put TLS termination in front.
	AdminAddr string
	// AdminToken is the bearer token every admin endpoint but /healthz
	// requires (Authorization: Bearer <token>); at least 16 printable
	// characters. cmd/host fills it from USHER_ADMIN_TOKEN. Empty: the
	// token is read from AdminTokenFile.
	AdminToken string
	// AdminTokenFile holds the token when AdminToken is empty. A file that
	// does not exist is created on first start with a random token (32
	// bytes, hex), mode 0600 in a directory created 0700, atomically and
	// exclusively: hosts that share the file agree on one token. A file
	// that group or others may read is refused. Default
	// admin.DefaultTokenFile(): $XDG_STATE_HOME/usher/admin-token, else
	// ~/.local/state/usher/admin-token, which `host plugins` reads too.
	// The path is logged, never the token.
	AdminTokenFile string
	// AdminAllowedHosts are further names the admin API answers to in the
	// Host and Origin headers ("name" with any port, "name:port" with that
	// one), for a host reached by a DNS name or through a proxy. Always
	// allowed: the listener's own address, localhost, 127.0.0.1 and
	// [::1]. Any other Host (DNS rebinding) or foreign Origin (a web page's
	// request) is refused with 403.
	AdminAllowedHosts []string
	// ConsoleChartWindow is how far back the web console's overview
	// charts (served under /console/ on the admin listener) go, and
	// ConsoleChartBucket the time one point of them counts. They count the
	// job history of every host, so keep the window within
	// HistoryRetention. Defaults 1h and 1m (the console's).
	ConsoleChartWindow, ConsoleChartBucket time.Duration

	// Logger defaults to a JSON slog logger on stderr.
	Logger *slog.Logger
}

// setDefaults checks what the caller set, fills every default (in this
// one place: fill) and checks the retention windows against the result.
func (c *Config) setDefaults() error {
	if c.Pool == nil && c.DatabaseURL == "" {
		return errors.New("host: DatabaseURL (or Pool) is required")
	}
	if c.Redis == nil && c.RedisURL == "" {
		return errors.New("host: RedisURL (or Redis) is required")
	}
	if err := checkPassfile(); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if n := len(c.SigningKey); n > 0 && n < entry.MinKeyLen {
		return fmt.Errorf("host: SigningKey is %d bytes; at least %d are needed", n, entry.MinKeyLen)
	}
	for _, kv := range c.PluginEnv {
		// A plugin told it is only asked its manifest serves no job; one
		// given another parent pid watches the wrong process.
		if name, _, _ := strings.Cut(kv, "="); name == contract.ManifestOnlyEnv || name == contract.ParentPIDEnv {
			return fmt.Errorf("host: PluginEnv %s: the host sets it itself (the plugin contract's), never a deployment", name)
		}
	}
	if c.StreamShards < 0 || c.StreamShards > stream.MaxShards {
		return fmt.Errorf("host: StreamShards %d: must be between 1 and %d (0: the default, 1)", c.StreamShards, stream.MaxShards)
	}
	if c.BatchMax < 0 {
		return fmt.Errorf("host: BatchMax %d is negative; 1 runs every job in its own transaction", c.BatchMax)
	}
	if c.RollbackFailureShare < 0 || c.RollbackFailureShare > 1 {
		return fmt.Errorf("host: RollbackFailureShare %v is not within (0, 1]", c.RollbackFailureShare)
	}
	c.fill()
	if c.IdleInTransactionTimeout <= c.JobTimeout {
		return fmt.Errorf("host: IdleInTransactionTimeout %s must exceed JobTimeout %s: the server would end a job's session while it runs", c.IdleInTransactionTimeout, c.JobTimeout)
	}
	return c.checkRetention()
}

// fill sets every field left zero to its default.
func (c *Config) fill() {
	if c.Stream == "" {
		c.Stream = "usher:{jobs}"
	}
	if c.StreamShards == 0 {
		c.StreamShards = 1
	}
	if c.Group == "" {
		c.Group = "usher"
	}
	if c.Consumer == "" {
		name, _ := os.Hostname()
		c.Consumer = fmt.Sprintf("%s-%d", name, os.Getpid())
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.StalledAfter <= 0 {
		c.StalledAfter = 2 * time.Second
	}
	if c.BatchMax == 0 {
		c.BatchMax = 128
	}
	if c.BatchWait == 0 {
		c.BatchWait = 2 * time.Millisecond
	}
	if c.MaxEntryBytesHeld <= 0 {
		c.MaxEntryBytesHeld = 64 << 20
	}
	c.MaxEntryBytesHeld = max(c.MaxEntryBytesHeld, entry.MaxBytes)
	if c.IdlePoll <= 0 {
		c.IdlePoll = 200 * time.Millisecond
	}
	if c.ReclaimIdle <= 0 {
		c.ReclaimIdle = 60 * time.Second
	}
	if c.UnknownKindWait == 0 {
		c.UnknownKindWait = time.Hour
	}
	if c.JobTimeout <= 0 {
		c.JobTimeout = 30 * time.Second
	}
	if c.MaxDeliveries <= 0 {
		c.MaxDeliveries = 10
	}
	if c.PoisonCrashes <= 0 {
		c.PoisonCrashes = 3
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 8
	}
	if c.PluginPoolSize <= 0 {
		c.PluginPoolSize = min(DefaultPluginPoolSize, c.Concurrency)
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = 5 * time.Second
	}
	if c.IdleInTransactionTimeout <= 0 {
		c.IdleInTransactionTimeout = c.JobTimeout + 10*time.Second
	}
	if c.StatementTimeout <= 0 {
		c.StatementTimeout = 10 * time.Second
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = time.Second
	}
	if c.HostLeaseTTL == 0 {
		c.HostLeaseTTL = 5 * time.Second
	}
	if c.ReclaimInterval <= 0 {
		c.ReclaimInterval = max(c.ReclaimIdle/4, 100*time.Millisecond)
	}
	if c.ReconcileAfter <= 0 {
		c.ReconcileAfter = 15 * time.Minute
	}
	if c.PausePollInterval <= 0 {
		c.PausePollInterval = time.Second
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = 10 * time.Second
	}
	if c.RollbackWindow == 0 {
		c.RollbackWindow = time.Minute
	}
	if c.RollbackFailureShare == 0 {
		c.RollbackFailureShare = 0.5
	}
	if c.RollbackMinJobs <= 0 {
		c.RollbackMinJobs = 10
	}
	if c.HistoryRetention <= 0 {
		c.HistoryRetention = 7 * 24 * time.Hour
	}
	if c.StreamTrimInterval == 0 {
		c.StreamTrimInterval = 5 * time.Second
	}
	if c.CleanupInterval <= 0 {
		c.CleanupInterval = time.Minute
	}
	if c.ConsumerIdleRemove == 0 {
		c.ConsumerIdleRemove = 24 * time.Hour
	}
	if c.RetentionMargin <= 0 {
		c.RetentionMargin = 5 * time.Minute
	}
	if c.PluginPollInterval <= 0 {
		c.PluginPollInterval = 2 * time.Second
	}
	if c.PluginRetryInterval <= 0 {
		c.PluginRetryInterval = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
}

// LogValue prints the configuration with secrets masked.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("database_url", maskURL(c.DatabaseURL)),
		slog.String("redis_url", maskURL(c.RedisURL)), slog.String("redis_ca_file", c.RedisCAFile),
		slog.String("signing_key", keySource(c.SigningKey)),
		slog.String("stream", c.Stream), slog.Int("stream_shards", c.StreamShards), slog.String("group", c.Group), slog.String("consumer", c.Consumer),
		slog.String("plugin_dir", c.PluginDir), slog.Bool("plugin_watch", c.PluginDir != "" && !c.DisablePluginWatch),
		slog.Any("plugins", c.Plugins), slog.Bool("allow_superuser", c.AllowSuperuser),
		slog.Int("plugin_pool_size", c.PluginPoolSize), slog.Duration("lock_timeout", c.LockTimeout),
		slog.Duration("idle_in_transaction_timeout", c.IdleInTransactionTimeout), slog.Duration("rollback_window", c.RollbackWindow),
		slog.Float64("rollback_failure_share", c.RollbackFailureShare), slog.Int("rollback_min_jobs", c.RollbackMinJobs),
		slog.Int("concurrency", c.Concurrency), slog.Int64("max_entry_bytes_held", c.MaxEntryBytesHeld),
		slog.Duration("reclaim_idle", c.ReclaimIdle), slog.Duration("host_lease_ttl", c.HostLeaseTTL), slog.Duration("history_retention", c.HistoryRetention),
		slog.Duration("workflow_retention", c.WorkflowRetention),
		slog.Duration("unknown_kind_wait", c.UnknownKindWait),
		slog.Duration("job_timeout", c.JobTimeout), slog.Duration("stalled_after", c.StalledAfter), slog.Int("batch_max", c.BatchMax), slog.Duration("batch_wait", c.BatchWait), slog.Int64("max_deliveries", c.MaxDeliveries),
		slog.Int("max_attempts", c.MaxAttempts), slog.Int("poison_crashes", c.PoisonCrashes), slog.Bool("relay", !c.DisableRelay), slog.Int("relay_replicas", c.RelayReplicas),
		slog.Bool("scheduler", !c.DisableScheduler), slog.String("admin_addr", c.AdminAddr),
		slog.String("admin_token", maskSecret(c.AdminToken)), slog.String("admin_token_file", c.AdminTokenFile),
		slog.Any("admin_allowed_hosts", c.AdminAllowedHosts),
		slog.Duration("stream_trim_interval", c.StreamTrimInterval), slog.Duration("cleanup_interval", c.CleanupInterval),
		slog.Duration("consumer_idle_remove", c.ConsumerIdleRemove), slog.Duration("processed_jobs_retention", c.ProcessedJobsRetention),
		slog.Duration("outbox_retention", c.OutboxRetention), slog.Duration("dead_letter_retention", c.DeadLetterRetention),
		slog.Duration("retention_margin", c.RetentionMargin),
	)
}

// checkPassfile refuses the passfile the host's pools read their passwords
// from (PGPASSFILE, else ~/.pgpass when there is one, as libpq and pgx
// find it) when group or others may read it.
func checkPassfile() error {
	path := os.Getenv("PGPASSFILE")
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil
		}
		path = filepath.Join(home, ".pgpass")
	}
	if err := secretfile.Check("passfile", path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func maskSecret(s string) string {
	if s == "" {
		return ""
	}
	return "xxxxx"
}

// keySource says where the signing key comes from, never the key.
func keySource(key []byte) string {
	if len(key) > 0 {
		return "configured (masked)"
	}
	return "database"
}

// RedisOptions parses a Redis URL (redis:// or rediss:// for TLS, with an
// optional user and password for a Redis ACL user) and, for rediss://,
// trusts only the CA certificates in caFile when it is set.
func RedisOptions(redisURL, caFile string) (*redis.Options, error) {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if caFile == "" {
		return opt, nil
	}
	if opt.TLSConfig == nil {
		return nil, fmt.Errorf("a Redis CA file (%s) is set but the Redis URL is not rediss:// (TLS)", caFile)
	}
	roots, err := caPool(caFile)
	if err != nil {
		return nil, err
	}
	opt.TLSConfig.RootCAs = roots
	return opt, nil
}

// caPool is the CA certificates in the PEM file caFile.
func caPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("redis CA file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("redis CA file %s holds no PEM certificate", caFile)
	}
	return roots, nil
}

// MaskURL is s with its password, if any, masked: for logs and printed
// configurations.
func MaskURL(s string) string { return maskURL(s) }

func maskURL(s string) string {
	if IsClusterURL(s) {
		return maskClusterURL(s)
	}
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

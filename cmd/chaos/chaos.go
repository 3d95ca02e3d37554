package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/localcluster"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/tickets/mail"
)

// The hosts' defaults: chaos reads and writes the same stream and group
// (its shards: stream.ShardKeys of streamKey).
const (
	streamKey = "usher:{jobs}"
	groupName = "usher"
)

// workMarker marks a work directory as chaos', so a later run may empty it.
const workMarker = ".usher-chaos"

// quietRedisLog drops go-redis' own log lines (a dial refused while chaos
// has Redis down is expected); errors reach chaos through return values.
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

// chaos is one run.
type chaos struct {
	cfg   config
	out   io.Writer
	outMu sync.Mutex
	start time.Time
	work  string

	pg *postgres
	// redis is the single node, cluster the cluster of --redis-cluster:
	// one of them is nil.
	redis   *redisServer
	cluster *localcluster.Cluster
	mail    *proc
	mailURL string
	mailer  *mail.Client

	dbURL, redisURL   string
	adminToken        string // every host's admin API token (USHER_ADMIN_TOKEN)
	blobDir, faultDir string
	pool              *pgxpool.Pool
	// rdb is a client of the Redis the hosts use, the one they build
	// from the same URL: every read of the stream goes through it, a shard
	// at a time (shards), so the same code serves the node and the cluster.
	rdb    redis.UniversalClient
	shards []string

	hosts     []*hostSlot
	hostsWG   sync.WaitGroup
	stopHosts context.CancelFunc

	load *loader
	inj  *injector
}

func (c *chaos) say(format string, a ...any) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	fmt.Fprintf(c.out, "chaos %7s  %s\n", c.since(), fmt.Sprintf(format, a...))
}

func (c *chaos) since() string {
	return fmt.Sprintf("t+%.1fs", time.Since(c.start).Seconds())
}

func (c *chaos) path(name string) string { return filepath.Join(c.work, name) }

// replayCommand is the command line that replays this run's schedule.
func (c *chaos) replayCommand() string {
	cfg := c.cfg
	args := []string{"chaos", "--host-bin", cfg.hostBin, "--plugin-dir", cfg.pluginDir, "--mailprovider", cfg.mailBin}
	if cfg.short {
		args = append(args, "--short")
	}
	if cfg.redisCluster {
		args = append(args, "--redis-cluster")
	}
	var kinds []string
	for _, k := range cfg.faults {
		kinds = append(kinds, k.String())
	}
	args = append(args, "--hosts", fmt.Sprint(cfg.hosts), "--orders", fmt.Sprint(cfg.orders),
		"--duration", cfg.duration.String(), "--rounds", fmt.Sprint(cfg.rounds),
		"--stream-shards", fmt.Sprint(cfg.streamShards), "--faults", strings.Join(kinds, ","), "--seed", fmt.Sprint(cfg.seed))
	if !cfg.redisAOF {
		args = append(args, "--redis-aof=false")
	}
	return strings.Join(args, " ")
}

// runChaos is the whole run: start everything, load and break it, drain,
// check. It stops every child before it returns.
func runChaos(ctx context.Context, cfg config, out io.Writer) (err error) {
	if err := faults.RequireChaosBuilds(cfg.pluginDir, "counters", "tickets", "checkout"); err != nil {
		return err
	}
	redis.SetLogger(quietRedisLog{})
	c := &chaos{cfg: cfg, out: out, start: time.Now()}
	if err := c.setupWorkDir(); err != nil {
		return err
	}
	c.say("seed %d; work dir %s (every process logs there)", cfg.seed, c.work)
	c.say("replay: %s", c.replayCommand())
	defer func() { c.cleanup(err) }()

	if err := c.startStores(ctx); err != nil {
		return err
	}
	if err := c.startMail(); err != nil {
		return err
	}
	if err := c.migrate(ctx); err != nil {
		return err
	}
	if c.pool, err = pgxpool.New(ctx, c.dbURL); err != nil {
		return err
	}
	if c.rdb, err = host.NewRedisClient(c.redisURL, ""); err != nil {
		return err
	}
	c.shards = stream.ShardKeys(streamKey, cfg.streamShards)
	if c.cluster != nil {
		c.sayShardOwners(ctx)
	}
	if c.load, err = c.newLoader(ctx); err != nil {
		return err
	}
	if err := c.startHosts(ctx); err != nil {
		return err
	}
	c.inj = c.newInjector()
	c.say("placing %d orders over %s on %d hosts (reclaim threshold %s, claim lease %s); %d faults planned: %d round(s) of %d type(s)",
		cfg.orders, cfg.duration, cfg.hosts, cfg.reclaimIdle, cfg.lease, len(c.inj.plan), cfg.rounds, len(cfg.faults))

	loadStart := time.Now()
	progressCtx, stopProgress := context.WithCancel(ctx)
	go c.progressLoop(progressCtx, min(max(cfg.duration/15, 3*time.Second), 30*time.Second))
	var wg sync.WaitGroup
	var loadErr error
	var checkoutErr error
	wg.Add(3)
	go func() {
		defer wg.Done()
		loadErr = c.load.run(ctx, cfg.duration)
	}()
	go func() {
		defer wg.Done()
		checkoutErr = c.load.runCheckouts(ctx, cfg.duration)
	}()
	go func() {
		defer wg.Done()
		c.inj.run(ctx, loadStart)
	}()
	wg.Wait()
	stopProgress()
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if loadErr != nil {
		return fmt.Errorf("placing orders: %w", loadErr)
	}
	if checkoutErr != nil {
		return fmt.Errorf("checkouts: %w", checkoutErr)
	}
	c.say("load done: %d orders confirmed (%d commits ambiguous, %d attempts retried); faults stop",
		c.load.confirmed.Load(), c.load.ambiguous.Load(), c.load.failed.Load())
	c.inj.settle(ctx)

	drainStart := time.Now()
	drainErr := c.drain(ctx, cfg.drainTimeout)
	drained := time.Since(drainStart)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	probeFailures := c.probe(ctx)
	if err := c.drain(ctx, time.Minute); err != nil && drainErr == nil {
		drainErr = fmt.Errorf("after the probes: %w", err)
	}
	hostStatus := c.pluginStatus()
	c.say("stopping the hosts")
	c.stopHosts()
	c.hostsWG.Wait()
	ok, err := c.check(ctx, loadStart, drained, hostStatus, probeFailures)
	if err != nil {
		return err
	}
	if drainErr != nil {
		return drainErr
	}
	if !ok {
		return errors.New("an invariant does not hold (see above)")
	}
	return nil
}

func (c *chaos) setupWorkDir() error {
	if c.cfg.workDir == "" {
		d, err := os.MkdirTemp("", fmt.Sprintf("usher-chaos-%d-", c.cfg.seed))
		if err != nil {
			return err
		}
		c.work = d
	} else {
		abs, err := filepath.Abs(c.cfg.workDir)
		if err != nil {
			return err
		}
		// Empty it only when it is empty already or an earlier run's.
		entries, _ := os.ReadDir(abs)
		if _, err := os.Stat(filepath.Join(abs, workMarker)); len(entries) > 0 && err != nil {
			return fmt.Errorf("--workdir %s is not empty and not an earlier chaos run's; refusing to empty it", abs)
		}
		if err := os.RemoveAll(abs); err != nil {
			return err
		}
		c.work = abs
	}
	for _, sub := range []string{"", "blobs", "mail", "faults", "redis"} {
		if err := os.MkdirAll(filepath.Join(c.work, sub), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(c.path(workMarker), []byte(c.replayCommand()+"\n"), 0o644); err != nil {
		return err
	}
	c.blobDir, c.faultDir = c.path("blobs"), c.path("faults")
	for _, p := range []*string{&c.cfg.hostBin, &c.cfg.pluginDir, &c.cfg.mailBin} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (run `make build`)", err)
		}
		*p = abs
	}
	return nil
}

func (c *chaos) startStores(ctx context.Context) error {
	var err error
	if c.pg, err = newPostgres(ctx, c.cfg.pgBinDir, c.path("postgres.log")); err != nil {
		return err
	}
	if err := c.pg.start(ctx); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.pg.url("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE usher")
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	// The hosts log in as the runtime's owner, never as a superuser; the
	// administrator's one step creates it and the plugins' login roles.
	setup := exec.CommandContext(ctx, c.cfg.hostBin, "setup", "--admin-url", c.pg.url("usher"),
		"--owner", "usher", "--plugin", "counters", "--plugin", "tickets", "--plugin", "checkout")
	if out, err := setup.CombinedOutput(); err != nil {
		return fmt.Errorf("host setup: %w\n%s", err, out)
	}
	c.dbURL = strings.Replace(c.pg.url("usher"), "postgres://postgres@", "postgres://usher@", 1)
	tok := make([]byte, 32)
	if _, err := crand.Read(tok); err != nil {
		return err
	}
	c.adminToken = hex.EncodeToString(tok)
	c.say("postgres (pid %d, %s) at 127.0.0.1:%d, data in %s", c.pg.p.pid(), c.pg.binDir, c.pg.port, c.pg.root)

	if c.cfg.redisCluster {
		if c.cluster, err = localcluster.Start(c.path("redis")); err != nil {
			return err
		}
		c.redisURL = c.cluster.URL()
		c.say("redis cluster of 3 primaries with a replica each at %s, no persistence (a failed primary's replica holds the stream; the relay waits for one, --relay-replicas 1); each node logs to %s",
			strings.Join(c.cluster.Addrs(), ", "), filepath.Join(c.path("redis"), "<port>", "redis.log"))
		return nil
	}
	if c.redis, err = newRedis(c.path("redis"), c.path("redis.log"), c.cfg.redisAOF); err != nil {
		return err
	}
	if err := c.redis.start(ctx); err != nil {
		return err
	}
	c.redisURL = c.redis.url()
	persistence := "appendonly yes, appendfsync always"
	if !c.cfg.redisAOF {
		persistence = "NO persistence (--redis-aof=false): a Redis crash loses the stream"
	}
	c.say("redis (pid %d) at 127.0.0.1:%d, %s", c.redis.p.pid(), c.redis.port, persistence)
	return nil
}

func (c *chaos) startMail() error {
	logf, err := openLog(c.path("mailprovider.log"))
	if err != nil {
		return err
	}
	outPath := c.path("mailprovider.out")
	outf, err := os.Create(outPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.cfg.mailBin, "-addr", "127.0.0.1:0", "-data", c.path("mail"))
	cmd.Stdout = outf
	p, err := spawn("mailprovider", cmd, logf)
	outf.Close()
	if err != nil {
		logf.Close()
		return err
	}
	c.mail = p
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, _ := os.ReadFile(outPath)
		if line, _, ok := strings.Cut(string(b), "\n"); ok {
			c.mailURL = strings.TrimSpace(strings.TrimPrefix(line, "mailprovider listening on "))
			break
		}
		if p.exited() || time.Now().After(deadline) {
			return fmt.Errorf("mail provider did not start (%s); see %s", p.exitStatus(), logf.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.mailer = &mail.Client{BaseURL: c.mailURL}
	c.say("mail provider (pid %d) at %s", p.pid(), c.mailURL)
	return nil
}

// migrate applies the migrations once before the hosts start (each host
// would apply the runtime's too, at its start), with Stagedoor's own: the
// hosts install the plugins, whose grants name Stagedoor's tables.
func (c *chaos) migrate(ctx context.Context) error {
	logf, err := openLog(c.path("migrate.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, c.cfg.hostBin, "migrate", "--stagedoor")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+c.dbURL)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("host migrate: %w (see %s)", err, logf.Name())
	}
	return nil
}

func (c *chaos) startHosts(ctx context.Context) error {
	hctx, cancel := context.WithCancel(ctx)
	c.stopHosts = cancel
	for i := range c.cfg.hosts {
		h, err := c.newHostSlot(i)
		if err != nil {
			return err
		}
		c.hosts = append(c.hosts, h)
		c.hostsWG.Add(1)
		go func() {
			defer c.hostsWG.Done()
			h.keep(hctx)
		}()
	}
	timeout := time.After(2 * time.Minute)
	for _, h := range c.hosts {
		select {
		case <-h.ready:
		case <-timeout:
			return fmt.Errorf("%s did not become healthy within 2m (see %s)", h.name, h.logf.Name())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var names []string
	for _, h := range c.hosts {
		if p := h.running(); p != nil {
			var ps []string
			for n, pid := range plugins(p) {
				ps = append(ps, fmt.Sprintf("%s %d", n, pid))
			}
			names = append(names, fmt.Sprintf("%s (pid %d; plugins %s)", h.name, p.pid(), strings.Join(ps, ", ")))
		}
	}
	c.say("hosts up: %s", strings.Join(names, "; "))
	for name, ps := range c.pluginStatus() {
		served := map[string]bool{}
		for _, p := range ps {
			served[p.Name] = p.Healthy
		}
		if !served["counters"] || !served["tickets"] || !served["checkout"] {
			return fmt.Errorf("%s does not serve the counters, tickets and checkout plugins (%v): does %s hold their binaries and manifests (make chaos-plugins)?",
				name, served, c.cfg.pluginDir)
		}
	}
	return nil
}

// cleanup stops every child, hosts first, and removes the data of a
// successful run (the logs stay).
func (c *chaos) cleanup(runErr error) {
	if c.inj != nil {
		c.inj.recover.Wait()
	}
	if c.stopHosts != nil {
		c.stopHosts()
		c.hostsWG.Wait()
	}
	if c.pool != nil {
		c.pool.Close()
	}
	if c.rdb != nil {
		_ = c.rdb.Close()
	}
	if c.mail != nil {
		c.mail.stop(syscall.SIGTERM, 10*time.Second)
	}
	if c.redis != nil {
		c.redis.close()
	}
	if c.cluster != nil {
		c.cluster.Stop()
	}
	// A failed run keeps its data for a post-mortem; an interrupted one
	// does not.
	keep := c.cfg.keep || runErr != nil && !errors.Is(runErr, context.Canceled)
	if c.pg != nil {
		c.pg.close(!keep)
		if keep {
			c.say("Postgres data kept in %s (start it with: %s/postgres -D %s)", c.pg.data, c.pg.binDir, c.pg.data)
		}
	}
	if !keep {
		for _, sub := range []string{"blobs", "mail", "redis"} {
			_ = os.RemoveAll(c.path(sub))
		}
	}
	c.say("all child processes stopped; logs in %s", c.work)
}

// probe proves every host recovered from the faults: with the others
// stopped, each host alone must take a fresh order through all three jobs
// (counter, render, send).
func (c *chaos) probe(ctx context.Context) []string {
	var failures []string
	for _, h := range c.hosts {
		p := h.running()
		if p == nil {
			failures = append(failures, h.name+" is not running after the faults")
			continue
		}
		var stopped []*hostSlot
		var procs []*proc
		for _, o := range c.hosts {
			if op := o.running(); o != h && op != nil && o.stop(op, false) {
				stopped, procs = append(stopped, o), append(procs, op)
			}
		}
		err := waitStopped(procs)
		if err == nil {
			// A stopped host blocked in XREADGROUP would still be handed
			// the probe's entries until its BLOCK (2 s) runs out.
			sleepCtx(ctx, 2500*time.Millisecond)
		}
		start := time.Now()
		if err == nil {
			err = c.probeOrder(ctx, h.name, 45*time.Second)
		}
		if err != nil {
			c.say("probe: %s FAILED: %v", h.name, err)
			c.explainStuck(ctx)
			failures = append(failures, fmt.Sprintf("%s alone did not serve a fresh order after the faults: %v (see %s)", h.name, err, h.logf.Name()))
		} else {
			c.say("probe: %s alone served a fresh order end to end in %s", h.name, time.Since(start).Round(100*time.Millisecond))
		}
		for i, o := range stopped {
			o.cont(procs[i])
		}
	}
	return failures
}

// waitStopped waits until the kernel reports every process stopped.
func waitStopped(ps []*proc) error {
	deadline := time.Now().Add(2 * time.Second)
	for _, p := range ps {
		for procState(p.pid()) != 'T' {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s (pid %d) is not stopped after SIGSTOP (state %q)", p.name, p.pid(), procState(p.pid()))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// explainStuck prints what Postgres and the stream hold when a probe is
// stuck: the sessions waiting on a lock and who blocks them, and the
// pending entries with their consumer.
func (c *chaos) explainStuck(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := c.pool.Query(ctx, `
		SELECT a.pid, a.application_name, a.state, coalesce(a.wait_event_type, ''), coalesce(a.wait_event, ''),
		       now() - a.xact_start, pg_blocking_pids(a.pid)::text, left(a.query, 120)
		FROM pg_stat_activity a
		WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
		ORDER BY a.xact_start`)
	if err == nil {
		_ = forEach(rows, func(r pgx.Rows) error {
			var pid int
			var app, state, wtype, wevent, blockers, query string
			var age time.Duration
			if err := r.Scan(&pid, &app, &state, &wtype, &wevent, &age, &blockers, &query); err != nil {
				return err
			}
			c.say("  postgres session %d %s: %s for %s, waiting on %s/%s, blocked by %s: %s",
				pid, app, state, age.Round(time.Millisecond), wtype, wevent, blockers, query)
			return nil
		})
	}
	for _, key := range c.shards {
		pend, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: groupName, Start: "-", End: "+", Count: 20}).Result()
		if err != nil {
			c.say("  %s: XPENDING: %v", key, err)
			continue
		}
		for _, x := range pend {
			c.say("  pending entry %s %s: consumer %s, idle %s, delivered %d times", key, x.ID, x.Consumer, x.Idle.Round(time.Millisecond), x.RetryCount)
		}
	}
}

func (c *chaos) probeOrder(ctx context.Context, host string, timeout time.Duration) error {
	rng := rand.New(rand.NewPCG(c.cfg.seed, 3))
	pl, err := c.load.place(ctx, c.load.order(rng, "chaos-probe-"+host), nil)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		var counted, rendered, sent bool
		err := c.pool.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM counter_applies WHERE order_id = $1),
			NOT EXISTS (SELECT 1 FROM tickets WHERE order_id = $1 AND pdf_key IS NULL),
			EXISTS (SELECT 1 FROM plugin_tickets.email_sends WHERE order_id = $1 AND sent_at IS NOT NULL)`, pl.ID).
			Scan(&counted, &rendered, &sent)
		if err == nil && counted && rendered && sent {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("order %d after %s: counted %v, rendered %v, sent %v", pl.ID, timeout, counted, rendered, sent)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// sayShardOwners prints which primary serves which shard.
func (c *chaos) sayShardOwners(ctx context.Context) {
	owners, err := c.shardOwners(ctx)
	if err != nil {
		c.say("redis cluster: who serves the shards: %v", err)
		return
	}
	var parts []string
	for _, a := range slices.Sorted(maps.Keys(owners)) {
		parts = append(parts, fmt.Sprintf("%s serves %s", a, strings.Join(owners[a], ", ")))
	}
	c.say("%d stream shards: %s", len(c.shards), strings.Join(parts, "; "))
}

// shardOwners maps each primary serving a shard to its shards' keys.
func (c *chaos) shardOwners(ctx context.Context) (map[string][]string, error) {
	owners := map[string][]string{}
	for _, key := range c.shards {
		p, err := c.cluster.PrimaryFor(ctx, key)
		if err != nil {
			return nil, err
		}
		owners[p] = append(owners[p], key)
	}
	return owners, nil
}

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/contract"
	"github.com/usherhq/usher/migrations"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/stagedoor/appdb"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/inprocess"
)

// group is the consumer group of every bench host (each on a stream of its own).
const group = "usher-bench"

// pollEvery is how often completion is polled: the clock's resolution.
const pollEvery = 10 * time.Millisecond

func suffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// database is the run's own database: created by the administrator, used by
// the owner, dropped at the end.
type database struct {
	rootURL  string // the administrator on the database it connects to (--admin-url)
	adminURL string // the administrator on the run's database
	ownerURL string // the owner on the run's database
	name     string
	pool     *pgxpool.Pool // the owner's, for seeding, producing and polling
	// deployment is the run's own; roles are what drop removes after
	// the database.
	deployment string
	roles      []string
}

// createDatabase creates a fresh database, sets up the owner and the
// plugins' roles on it (sandbox.Setup, as `host setup` does), migrates it
// as the owner (the runtime's and Stagedoor's tables) and installs the
// plugins of cfg.PluginDir (`host plugins install`).
func createDatabase(ctx context.Context, cfg config) (*database, error) {
	admin, err := pgx.Connect(ctx, cfg.AdminURL)
	if err != nil {
		return nil, fmt.Errorf("connect as the administrator: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	// Each run is a deployment of its own (host setup --deployment): its
	// roles are made for it and dropped with its database, never the
	// tests', the demo's or a real deployment's on the same cluster.
	sfx := suffix()
	db := &database{rootURL: cfg.AdminURL, name: "usher_bench_" + sfx, deployment: "b" + sfx[:10]}
	owner := cfg.Owner
	if owner == "" {
		owner = sandbox.OwnerIn(db.deployment)
	}
	db.roles = []string{owner}
	for _, p := range benchPlugins {
		db.roles = append(db.roles, sandbox.PluginRoleIn(db.deployment, p), sandbox.SchemaRoleIn(db.deployment, p))
	}
	if cfg.Owner != "" {
		db.roles = db.roles[1:] // the operator's own owner role stays
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db.name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", db.name, err)
	}
	u, err := url.Parse(cfg.AdminURL)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + db.name
	db.adminURL = u.String()
	u.User = url.User(owner)
	db.ownerURL = u.String()
	if err := db.setup(ctx, owner, cfg.PluginDir); err != nil {
		_ = db.drop(context.WithoutCancel(ctx))
		return nil, err
	}
	return db, nil
}

func (db *database) setup(ctx context.Context, owner, pluginDir string) error {
	conn, err := pgx.Connect(ctx, db.adminURL)
	if err != nil {
		return fmt.Errorf("connect as the administrator to %s: %w", db.name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := sandbox.Setup(ctx, conn, sandbox.SetupConfig{Deployment: db.deployment, Owner: owner, Plugins: benchPlugins}); err != nil {
		return err
	}
	pc, err := pgxpool.ParseConfig(db.ownerURL)
	if err != nil {
		return err
	}
	pc.MaxConns = 4
	if db.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("connect as %s: %w", owner, err)
	}
	if err := migrations.Up(ctx, db.pool); err != nil {
		return err
	}
	if err := appdb.Migrate(ctx, db.pool); err != nil {
		return err
	}
	// The plugins' schemas and grants, as `host plugins install` makes
	// them: the in-process levels load no manifest. Only the plugins the
	// bench runs have roles; the directory may hold others (checkout).
	scan, err := pluginhost.ScanDir(pluginDir)
	if err != nil {
		return err
	}
	for _, p := range scan.Plugins {
		if !slices.Contains(benchPlugins, p.Manifest.Name) {
			continue
		}
		spec, err := plugindb.FromManifest(p)
		if err != nil {
			return err
		}
		if _, err := plugindb.Install(ctx, db.pool, spec); err != nil {
			return err
		}
	}
	return nil
}

// drop closes the owner's pool and drops the database.
func (db *database) drop(ctx context.Context) error {
	if db.pool != nil {
		db.pool.Close()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, db.rootURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	if _, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return err
	}
	var errs []error
	for _, r := range db.roles {
		if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize()); err != nil {
			errs = append(errs, fmt.Errorf("drop role %s: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// benchPlugins are the plugins each run's deployment has roles for.
var benchPlugins = []string{"counters", "tickets"}

// runningHost is one in-process host serving its own stream.
type runningHost struct {
	h           *host.Host
	stream      string
	concurrency int
	inProcess   bool
	cancel      context.CancelFunc
	done        chan error
}

// startHost builds a host with Concurrency = inflight on the owner's login
// and runs it until stop.
//
// inProcess serves the counters handler inside the host instead of from
// pluginDir (host.LoadInProcess): the same handles, guards and database
// role, without the process boundary, so the boundary's cost is a ratio.
func startHost(ctx context.Context, cfg config, db *database, pluginDir string, inflight int, inProcess bool, logger *slog.Logger) (*runningHost, error) {
	var p *sdk.Plugin
	if inProcess {
		// The counters plugin's main, served in this process.
		p = sdk.New("counters", "in-process")
		sdk.HandleRecordJobID(p, counter.Handler{Version: "in-process"})
	}
	return startHostServing(ctx, cfg, db, pluginDir, inflight, p, logger)
}

// startHostServing is startHost serving inProc inside the host when it is
// not nil, and pluginDir's plugins otherwise.
func startHostServing(ctx context.Context, cfg config, db *database, pluginDir string, inflight int, inProc *sdk.Plugin, logger *slog.Logger) (*runningHost, error) {
	hcfg, err := benchHostConfig(cfg, db, pluginDir, inflight, logger)
	if err != nil {
		return nil, err
	}
	if inProc != nil {
		hcfg.PluginDir = ""
	} else if cfg.CPUProfile != "" {
		// The plugin profiles itself over the window (startProfile).
		hcfg.PluginEnv = []string{contract.CPUProfileEnv + "=" + filepath.Join(cfg.CPUProfile, fmt.Sprintf("plugin-inflight-%d.pprof", inflight))}
	}
	return launchHost(ctx, hcfg, inProc)
}

// benchHostConfig is a host on the run's database, serving pluginDir with
// Concurrency inflight, on a stream and as a consumer of its own.
func benchHostConfig(cfg config, db *database, pluginDir string, inflight int, logger *slog.Logger) (host.Config, error) {
	dbURL := db.ownerURL
	if cfg.HostPoolSize > 0 {
		u, err := url.Parse(dbURL)
		if err != nil {
			return host.Config{}, err
		}
		q := u.Query()
		q.Set("pool_max_conns", strconv.Itoa(cfg.HostPoolSize))
		u.RawQuery = q.Encode()
		dbURL = u.String()
	}
	id := suffix()
	return host.Config{
		DatabaseURL: dbURL, RedisURL: cfg.RedisURL,
		Stream: "usher:bench:{" + id + "}", Group: group, Consumer: "bench-" + id,
		PluginDir: pluginDir, DisablePluginWatch: true,
		Concurrency: inflight, Logger: logger,
		BatchMax: cfg.BatchMax, PluginPoolSize: cfg.PluginPoolSize, BatchWait: cfg.BatchWait,
	}, nil
}

// launchHost builds the host of hcfg, serving inProc inside it when it is
// not nil, and runs it until stop.
func launchHost(ctx context.Context, hcfg host.Config, inProc *sdk.Plugin) (*runningHost, error) {
	inProcess, stream, inflight := inProc != nil, hcfg.Stream, hcfg.Concurrency
	h, err := host.New(ctx, hcfg)
	if err != nil {
		return nil, fmt.Errorf("start host: %w", err)
	}
	if inProcess {
		if err := h.LoadInProcess(ctx, "counters", inprocess.Server(inProc)); err != nil {
			h.Close()
			return nil, err
		}
	}
	if !slices.Contains(h.Kinds(), "update_sales_counter") {
		h.Close()
		return nil, fmt.Errorf("no plugin in %s serves update_sales_counter (run make plugins); refused: %+v", hcfg.PluginDir, h.Refusals())
	}
	runCtx, cancel := context.WithCancel(ctx)
	r := &runningHost{h: h, stream: stream, concurrency: inflight, inProcess: inProcess, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- h.Run(runCtx) }()
	return r, nil
}

func (r *runningHost) stop() error {
	r.cancel()
	err := <-r.done
	r.h.Close()
	return err
}

// The peers' workload (bench/cmd/peers/workload.go's seed): order g goes to
// an event and gets 1..6 seats by a fixed hash of g, so every runtime sees
// the same orders.
func workloadOrder(g int64, events []int64) orders.Order {
	return orders.Order{
		EventID: events[((g*2654435761)%1000003)%int64(len(events))],
		Buyer:   "bench", Email: "bench@example.com",
		Seats: int(1 + ((g*40503)%65521)%6),
	}
}

func createEvents(ctx context.Context, pool *pgxpool.Pool, label string, n int) ([]int64, error) {
	// One statement, as orders.CreateEvent makes each: the scale rows
	// create thousands.
	rows, err := pool.Query(ctx, `INSERT INTO events (name, venue, starts_at)
		SELECT 'bench ' || $1 || ' ' || i, 'bench', now() + interval '30 days' FROM generate_series(1, $2) i
		RETURNING id`, label, n)
	if err != nil {
		return nil, fmt.Errorf("create events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("create events: %w", err)
	}
	slices.Sort(evs)
	return evs, nil
}

// placeAll places n orders over events, each with its counter job's outbox
// row, in one transaction; beforeCommit runs just before it commits.
func placeAll(ctx context.Context, pool *pgxpool.Pool, events []int64, n int, p *progress, beforeCommit func()) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for g := int64(1); g <= int64(n); g++ {
		if _, err := orders.PlaceTx(ctx, tx, workloadOrder(g, events), orders.Jobs{Counter: true}); err != nil {
			return err
		}
		p.set(g)
	}
	if beforeCommit != nil {
		beforeCommit()
	}
	return tx.Commit(ctx)
}

// placeOrders commits n orders over events, without jobs or tickets (the
// counter job reads only the order's event and seats), in one statement,
// and returns their ids in the order of workloadOrder's g = 1..n.
func placeOrders(ctx context.Context, pool *pgxpool.Pool, events []int64, n int, p *progress) ([]int64, error) {
	evs, seats := make([]int64, n), make([]int32, n)
	for g := int64(1); g <= int64(n); g++ {
		o := workloadOrder(g, events)
		evs[g-1], seats[g-1] = o.EventID, int32(o.Seats)
	}
	rows, err := pool.Query(ctx, `
		INSERT INTO orders (public_id, event_id, buyer, email, seats)
		SELECT 'SD-' || upper(substr(md5(random()::text), 1, 10)), e, 'bench', 'bench@example.com', s
		FROM unnest($1::bigint[], $2::int[]) WITH ORDINALITY AS o(e, s, k)
		ORDER BY k
		RETURNING id`, evs, seats)
	if err != nil {
		return nil, fmt.Errorf("place orders: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("place orders: %w", err)
	}
	if len(ids) != n {
		return nil, fmt.Errorf("place orders: %d ids for %d orders", len(ids), n)
	}
	// The ids come from the sequence in the order the rows were
	// inserted, the ordinality's.
	slices.Sort(ids)
	p.set(int64(n))
	return ids, nil
}

// counterJob is the outbox message of an order's update_sales_counter job,
// as orders.PlaceTx writes it.
func counterJob(orderID int64) outbox.Message {
	payload, _ := json.Marshal(stagedoor.UpdateSalesCounter{OrderID: orderID})
	return outbox.Message{Kind: stagedoor.UpdateSalesCounter{}.Kind(), Payload: payload, RequestID: "bench-latency"}
}

// waiter tells when the jobs committed so far are all applied and acked.
// It reads the host's own counters (Host.Verdicts), in memory, as the peers
// count their applied jobs in their workers: a query every poll (a count
// over processed_jobs, which grows through the run) would tax the very
// database whose work is being timed. verify checks the effects after.
type waiter struct {
	h      *host.Host
	rdb    redis.UniversalClient
	stream string
}

// applied is the number of job runs this host has applied.
func (w waiter) applied() int64 { return w.h.Verdicts()["applied"] }

// wait polls until the host has applied want jobs and the stream has no
// pending entry, and returns when it saw that. A dead letter ends it with
// an error: that job will never be processed.
func (w waiter) wait(ctx context.Context, want, base int64, p *progress) (time.Time, error) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		v := w.h.Verdicts()
		n := v["applied"]
		p.set(n - base)
		if n >= want {
			pend, err := w.rdb.XPending(ctx, w.stream, group).Result()
			if err != nil {
				return time.Time{}, fmt.Errorf("xpending: %w", err)
			}
			if pend.Count == 0 {
				return time.Now(), nil
			}
		}
		if dead := v["dead_letter"]; dead > 0 {
			return time.Time{}, fmt.Errorf("%d jobs dead-lettered (see the host's log)", dead)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d of %d jobs processed: %w", n-base, want-base, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// throughput warms the host, then times cfg.Jobs jobs committed at once.
func throughput(ctx context.Context, cfg config, db *database, rh *runningHost, rdb redis.UniversalClient, p *progress) (levelResult, error) {
	res := levelResult{Inflight: rh.concurrency, Jobs: cfg.Jobs}
	w := waiter{h: rh.h, rdb: rdb, stream: rh.stream}
	evs, err := createEvents(ctx, db.pool, fmt.Sprintf("inflight %d", res.Inflight), cfg.Events)
	if err != nil {
		return res, err
	}
	base := w.applied()
	if cfg.Warmup > 0 {
		p.phase(fmt.Sprintf("inflight %d: warm-up", res.Inflight), int64(cfg.Warmup))
		if err := placeAll(ctx, db.pool, evs, cfg.Warmup, p, nil); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
		if _, err := w.wait(ctx, base+int64(cfg.Warmup), base, p); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
		base += int64(cfg.Warmup)
	}
	p.phase(fmt.Sprintf("inflight %d: committing %d jobs", res.Inflight, cfg.Jobs), int64(cfg.Jobs))
	var before sample
	if err := placeAll(ctx, db.pool, evs, cfg.Jobs, p, func() { before = takeSample(rh.h) }); err != nil {
		return res, fmt.Errorf("commit the jobs: %w", err)
	}
	stopProfile, err := startProfile(cfg, rh)
	if err != nil {
		return res, err
	}
	start := time.Now()
	p.phase(fmt.Sprintf("inflight %d: throughput", res.Inflight), int64(cfg.Jobs))
	end, err := w.wait(ctx, base+int64(cfg.Jobs), base, p)
	if perr := stopProfile(); err == nil {
		err = perr
	}
	after := takeSample(rh.h)
	if err != nil {
		return res, err
	}
	res.Seconds = end.Sub(start).Seconds()
	res.JobsPerSec = float64(cfg.Jobs) / res.Seconds
	res.usage(before, after)
	res.check, err = verify(ctx, db.pool, evs)
	return res, err
}

// startProfile starts a CPU profile of this process (the host) over a
// throughput window into cfg.CPUProfile, when set, and of each plugin
// process (started with contract.CPUProfileEnv: SIGUSR1 starts and stops its
// profile), and returns what stops them and writes the host's.
func startProfile(cfg config, rh *runningHost) (stop func() error, err error) {
	name := fmt.Sprintf("host-inflight-%d.pprof", rh.concurrency)
	if rh.inProcess {
		name = fmt.Sprintf("host-inflight-%d-in-process.pprof", rh.concurrency)
	}
	stopHost, err := startProfileAs(cfg, name)
	if err != nil || cfg.CPUProfile == "" || rh.inProcess {
		return stopHost, err
	}
	toggle := func() error {
		for _, p := range rh.h.Plugins() {
			if err := syscall.Kill(p.Pid, syscall.SIGUSR1); err != nil {
				return fmt.Errorf("plugin %s's cpu profile: %w", p.Name, err)
			}
		}
		return nil
	}
	if err := toggle(); err != nil {
		_ = stopHost()
		return nil, err
	}
	return func() error { return errors.Join(toggle(), stopHost()) }, nil
}

// startProfileAs starts a CPU profile of this process into the file name
// of cfg.CPUProfile, when set, and returns what stops and writes it.
func startProfileAs(cfg config, name string) (stop func() error, err error) {
	if cfg.CPUProfile == "" {
		return func() error { return nil }, nil
	}
	if err := os.MkdirAll(cfg.CPUProfile, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(cfg.CPUProfile, name))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// latency offers cfg.Rate jobs/s for cfg.RateSeconds, one order and outbox
// row per transaction, and reads each job's outbox commit → outcome time.
func latency(ctx context.Context, cfg config, db *database, rh *runningHost, rdb redis.UniversalClient, p *progress) (latencyResult, []float64, error) {
	total := cfg.Rate * cfg.RateSeconds
	res := latencyResult{Inflight: rh.concurrency, Rate: cfg.Rate, Seconds: cfg.RateSeconds, Jobs: total}
	w := waiter{h: rh.h, rdb: rdb, stream: rh.stream}
	evs, err := createEvents(ctx, db.pool, "latency", cfg.Events)
	if err != nil {
		return res, nil, err
	}
	base := w.applied()
	// The orders are committed before the clock, without their jobs: the
	// producers commit only the jobs, one outbox row per transaction, as
	// an application enqueues them. Placing each order with its job at the
	// rate (three statements and tickets rows per transaction) cost the
	// shared cores more than the jobs it measured: 20 producers achieved
	// 572-735 orders/s of the 1,000 asked for.
	p.phase(fmt.Sprintf("latency: placing %d orders", total), int64(total))
	orderIDs, err := placeOrders(ctx, db.pool, evs, total, p)
	if err != nil {
		return res, nil, err
	}
	// Producers enough to keep up with the rate when a commit takes up to
	// ~20ms on the shared cores, few enough to leave the server's
	// connection slots to the host (its plugin pool may open one per job
	// in flight).
	producers := min(24, max(2, cfg.Rate/50))
	pc, err := pgxpool.ParseConfig(db.ownerURL)
	if err != nil {
		return res, nil, err
	}
	pc.MaxConns = int32(producers)
	ppool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return res, nil, err
	}
	defer ppool.Close()

	phasesBefore := rh.h.BatchPhaseTotals()
	p.phase(fmt.Sprintf("latency: offering %d jobs/s for %ds", cfg.Rate, cfg.RateSeconds), int64(total))
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	due := make(chan int64)
	var (
		mu      sync.Mutex
		ids     []int64
		wg      sync.WaitGroup
		placed  int64
		lastEnd time.Time
		// commits is when each outbox row's commit returned to its
		// producer: the latency's start.
		commits = map[int64]time.Time{}
	)
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range due {
				// One statement outside a transaction block: it has
				// committed when it returns.
				outboxIDs, err := outbox.Add(pctx, ppool, counterJob(orderIDs[g-1]))
				if err != nil {
					cancel(fmt.Errorf("enqueue counter job: %w", err))
					return
				}
				committed := time.Now()
				mu.Lock()
				ids = append(ids, outboxIDs...)
				for _, id := range outboxIDs {
					commits[id] = committed
				}
				placed++
				lastEnd = committed
				p.set(placed)
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	interval := time.Second / time.Duration(cfg.Rate)
pace:
	for i := range int64(total) {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		select {
		case due <- i + 1:
		case <-pctx.Done():
			break pace
		}
	}
	close(due)
	wg.Wait()
	if err := context.Cause(pctx); err != nil {
		return res, nil, err
	}
	res.OfferedPerSec = float64(total) / lastEnd.Sub(start).Seconds()
	p.phase("latency: draining", int64(total))
	if _, err := w.wait(ctx, base+int64(total), base, p); err != nil {
		return res, nil, err
	}
	res.Batches = stepsBetween(phasesBefore, rh.h.BatchPhaseTotals())
	type stamps struct {
		ID                       int64
		Published, Started, Done time.Time
	}
	// started is when the host took the applied delivery from the stream
	// (its history row's started_at).
	rows, err := db.pool.Query(ctx, `
		SELECT x.id, x.published_at, h.started_at, x.done_at
		FROM outbox x JOIN job_history h ON h.outbox_id = x.id AND h.verdict = 'applied'
		WHERE x.id = ANY($1) AND x.done_at IS NOT NULL`, ids)
	if err != nil {
		return res, nil, err
	}
	done, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stamps])
	if err != nil {
		return res, nil, err
	}
	if len(done) != total {
		return res, nil, fmt.Errorf("latency: %d of %d outbox rows have an outcome", len(done), total)
	}
	// Postgres's clock and this process's are the machine's one clock. The
	// relay's pick-up (published_at, its transaction's start) can come
	// before the producer hears its commit: that leg counts as 0.
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var ms, relay, stream, run []float64
	first, last := lastEnd, time.Time{}
	for _, x := range done {
		c := commits[x.ID]
		picked := maxTime(x.Published, c)
		ms = append(ms, msOf(x.Done.Sub(c)))
		relay = append(relay, max(0, msOf(x.Published.Sub(c))))
		stream = append(stream, max(0, msOf(x.Started.Sub(picked))))
		run = append(run, msOf(x.Done.Sub(maxTime(x.Started, picked))))
		first, last = minTime(first, c), maxTime(last, x.Done)
	}
	res.AppliedPerSec = float64(len(done)) / last.Sub(first).Seconds()
	for _, leg := range [][]float64{relay, stream, run} {
		slices.Sort(leg)
	}
	res.RelayP50Ms, res.RelayP99Ms = quantile(relay, 0.50), quantile(relay, 0.99)
	res.StreamP50Ms, res.StreamP99Ms = quantile(stream, 0.50), quantile(stream, 0.99)
	res.RunP50Ms, res.RunP99Ms = quantile(run, 0.50), quantile(run, 0.99)
	slices.Sort(ms)
	res.P50Ms, res.P95Ms, res.P99Ms, res.MaxMs = quantile(ms, 0.50), quantile(ms, 0.95), quantile(ms, 0.99), ms[len(ms)-1]
	var sum float64
	for _, v := range ms {
		sum += v
	}
	res.MeanMs = sum / float64(len(ms))
	res.check, err = verify(ctx, db.pool, evs)
	return res, ms, err
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// quantile of sorted xs by the nearest-rank method.
func quantile(xs []float64, q float64) float64 {
	i := int(q*float64(len(xs))+0.999999) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// check is what verify finds: seats (per event) lost or doubled, and jobs
// (per order) lost. It reads only what the application and the runtime
// store, so it measures the shipped plugin, which records nothing for a
// benchmark.
type check struct {
	Lost     int64 `json:"lost"`      // seats missing from the events' counters
	Doubled  int64 `json:"doubled"`   // seats counted more than once
	LostJobs int64 `json:"lost_jobs"` // orders whose counter job is not in processed_jobs
}

// verify compares every event's seats_sold with the sum of its orders'
// seats, and finds the orders whose counter job was never recorded done.
// The job id goes into processed_jobs in the transaction of the increment,
// so a recorded job is an applied one; a doubled apply has no row of its
// own (processed_jobs' key is the job id) and shows in the seats, each
// order adding at least one.
func verify(ctx context.Context, pool *pgxpool.Pool, events []int64) (check, error) {
	var c check
	if err := pool.QueryRow(ctx, `
SELECT coalesce(sum(greatest(coalesce(x.expected, 0) - e.seats_sold, 0)), 0)::bigint,
       coalesce(sum(greatest(e.seats_sold - coalesce(x.expected, 0), 0)), 0)::bigint
FROM events e
LEFT JOIN (SELECT event_id, sum(seats) AS expected FROM orders GROUP BY event_id) x ON x.event_id = e.id
WHERE e.id = ANY($1)`, events).Scan(&c.Lost, &c.Doubled); err != nil {
		return c, fmt.Errorf("verify seats: %w", err)
	}
	if err := pool.QueryRow(ctx, `
SELECT count(*) FROM orders o
LEFT JOIN (SELECT DISTINCT (x.payload->>'order_id')::bigint AS order_id
           FROM outbox x JOIN processed_jobs p ON p.job_id = coalesce(x.job_id, x.id::text)
           WHERE x.kind = 'update_sales_counter') done ON done.order_id = o.id
WHERE o.event_id = ANY($1) AND done.order_id IS NULL`, events).Scan(&c.LostJobs); err != nil {
		return c, fmt.Errorf("verify jobs: %w", err)
	}
	return c, nil
}

// absorbed reads the duplicates each guard absorbed.
func absorbedDuplicates(ctx context.Context, pool *pgxpool.Pool) ([]absorbed, error) {
	rows, err := pool.Query(ctx, `SELECT guard, kind, reason, count FROM absorbed_duplicates ORDER BY guard, kind, reason`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[absorbed])
}

// deleteStreams removes the hosts' stream keys and the keys kept beside
// them ({stream}:crashes:<id>).
func deleteStreams(ctx context.Context, rdb redis.UniversalClient, streams []string) error {
	var errs []error
	for _, s := range streams {
		keys := []string{s}
		iter := rdb.Scan(ctx, 0, s+":*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		errs = append(errs, iter.Err(), rdb.Del(ctx, keys...).Err())
	}
	return errors.Join(errs...)
}

// stagePlugin copies plugin name of cfg.PluginDir (its manifest, verbatim,
// and its binary) into a plugin directory of the run's own, so the host
// starts no other plugin whose role happens to exist: the throughput
// numbers are the counters plugin's alone. The host still verifies the
// manifest's SHA-256.
func stagePlugin(pluginDir, into, name string) error {
	manifest := name + ".plugin.json"
	b, err := os.ReadFile(filepath.Join(pluginDir, manifest))
	if err != nil {
		return fmt.Errorf("the %s plugin's manifest (run make plugins): %w", name, err)
	}
	var m struct {
		Binary     string `json:"binary"`
		Migrations string `json:"migrations"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %w", manifest, err)
	}
	if m.Binary == "" || m.Binary != filepath.Base(m.Binary) {
		return fmt.Errorf("%s: binary %q is not a file name", manifest, m.Binary)
	}
	if err := os.WriteFile(filepath.Join(into, manifest), b, 0o644); err != nil {
		return err
	}
	if m.Migrations != "" { // the plugin's own migrations, beside its manifest
		if m.Migrations != filepath.Base(m.Migrations) {
			return fmt.Errorf("%s: migrations %q is not a directory name", manifest, m.Migrations)
		}
		if err := os.CopyFS(filepath.Join(into, m.Migrations), os.DirFS(filepath.Join(pluginDir, m.Migrations))); err != nil {
			return fmt.Errorf("%s: migrations: %w", manifest, err)
		}
	}
	return copyFile(filepath.Join(pluginDir, m.Binary), filepath.Join(into, m.Binary))
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

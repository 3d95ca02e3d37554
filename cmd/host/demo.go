package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/mailproc"
	"github.com/usherhq/usher/plugins/stagedoor/appdb"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/mail"
)

type demo struct {
	orders      int
	checkouts   int
	hold        time.Duration
	pluginDir   string
	mailBin     string
	work        string
	reclaim     time.Duration
	lease       time.Duration
	seed        uint64
	conn        connFlags
	adminURL    string
	dbURL       string
	pool        *pgxpool.Pool
	rdb         *redis.Client
	mailer      *mail.Client
	relayDups   atomic.Int64
	pluginKills atomic.Int64
	// reserveKills counts kill -9s of the checkout plugin mid-reserve.
	reserveKills atomic.Int64
	// dbName, deployment and stream name the demo's database, its
	// deployment (whose owner is usher_<deployment>) and its stream; its
	// test gives them names of their own.
	dbName, deployment, stream string
	// out is where the demo reports: the command's stdout.
	out         io.Writer
	plan        checkoutPlan
	restart     restartReport
	latePayment string
}

func (cl *cli) demoFlags(fs *flag.FlagSet) runner {
	d := &demo{dbName: demoDatabase, deployment: demoDeployment, stream: demoStream, out: cl.stdout}
	// Only Redis's address: the demo makes its own database and stream.
	d.conn.registerRedis(fs)
	fs.StringVar(&d.adminURL, "admin-url", env("USHER_ADMIN_URL", demoAdminURL),
		"a database administrator's URL: the demo creates its database and roles with it; its hosts log in as the owner role usher (USHER_ADMIN_URL)")
	fs.IntVar(&d.orders, "orders", 300, "Stagedoor orders to place")
	fs.IntVar(&d.checkouts, "checkouts", 100, "Stagedoor checkouts to start (the checkout workflow, each in its order's transaction): about 70% paid, 15% left to time out, 15% cancelled")
	fs.DurationVar(&d.hold, "checkout-hold", 5*time.Second, "how long a checkout holds its seats waiting for the payment (15m in production; short so the demo is quick)")
	fs.StringVar(&d.pluginDir, "plugin-dir", "bin/chaos-plugins", "directory with the counters, tickets and checkout plugins' chaos builds, whose faults the demo arms (make chaos-plugins)")
	fs.StringVar(&d.mailBin, "mailprovider", "bin/mailprovider", "the mail provider binary")
	fs.StringVar(&d.work, "workdir", ".demo", "scratch directory (recreated)")
	fs.DurationVar(&d.reclaim, "reclaim-idle", 3*time.Second, "reclaim threshold (60s in production; short so the demo is quick)")
	fs.DurationVar(&d.lease, "lease", 4*time.Second, "send_tickets claim lease (2m in production)")
	fs.Uint64Var(&d.seed, "seed", uint64(time.Now().UnixNano()%1_000_000), "seed for the order mix")
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("demo takes no arguments, got %q", pos)}
		}
		if d.orders < 10 {
			return usageError{"demo: --orders must be at least 10"}
		}
		if d.checkouts < 10 {
			return usageError{"demo: --checkouts must be at least 10"}
		}
		return d.run(ctx)
	}
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.out, "demo: "+format+"\n", a...) }

func (d *demo) run(ctx context.Context) error {
	if err := d.prepare(ctx); err != nil {
		return err
	}
	defer d.pool.Close()
	defer d.rdb.Close()
	mailURL, stopMail, err := d.startMailProvider()
	if err != nil {
		return err
	}
	defer stopMail()
	d.mailer = &mail.Client{BaseURL: mailURL}

	// Faults, armed before the first order.
	faultDir := filepath.Join(d.work, "faults")
	killJob, slowJob := "1", "4" // outbox ids: order 1's counter job, order 2's render job
	must(faults.Arm(faultDir, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h", JobIDs: []string{killJob}, Once: true}))
	must(faults.Arm(faultDir, "render.after_check", faults.Spec{Action: "stall", Duration: (2 * d.reclaim).String(), JobIDs: []string{slowJob}, Once: true}))
	must(faults.Arm(faultDir, "send.after_effect", faults.Spec{Action: "crash", Every: 60, Once: true}))
	// The checkout plugin: killed with -9 while it holds ~1 in 15
	// reserves before their commit, and crashed after ~1 in 4 releases'
	// commit phase (the won write rolled back with the process).
	must(faults.Arm(faultDir, "reserve.before_commit", faults.Spec{Action: "stall", Duration: "1h", Every: 15, Once: true}))
	must(faults.Arm(faultDir, "release.after_commit", faults.Spec{Action: "crash", Every: 4, Once: true}))
	if err := d.mailer.SetFaults(ctx, mail.Faults{FailNext: 5, FailStatus: 503}); err != nil {
		return fmt.Errorf("demo: mail provider faults: %w", err)
	}
	d.say("faults armed: relay crash after publish (batches holding every 100th row), kill -9 of the plugin holding job %s, job %s stalled %s past the %s reclaim threshold, a crash after the provider accepted ~1 in 60 emails, 5 provider 503s; kill -9 of the checkout plugin holding ~1 in 15 reserves, a crash after ~1 in 4 releases' commit; both hosts restarted while checkouts sleep on their timers",
		killJob, slowJob, 2*d.reclaim, d.reclaim)

	_, stopHosts, err := d.startHosts(ctx, mailURL, faultDir)
	if err != nil {
		return err
	}
	start := time.Now()
	want, err := d.placeOrders(ctx)
	if err != nil {
		stopHosts()
		return err
	}
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		d.killWhenHeld(ctx, faultDir, "counter.before_apply", killJob)
	}()
	killCtx, stopKilling := context.WithCancel(ctx)
	defer stopKilling()
	go d.killEveryHolder(killCtx, faultDir, "reserve.before_commit")
	if err := d.placeCheckouts(ctx, want); err != nil {
		stopHosts()
		return err
	}
	cancelled := make(chan error, 1)
	go func() { cancelled <- d.cancelWhenHeld(ctx, 2*time.Minute) }()
	// A host restart with workflows asleep: once the checkouts left to
	// time out have their timers set (and the counters plugin was
	// killed), both hosts stop; they start again after the timers are
	// due, and the summary says how many slept through it.
	if err := d.waitSleeping(ctx, killed, 2*time.Minute); err != nil {
		stopHosts()
		return err
	}
	stopAt := time.Now()
	stopHosts()
	if err := d.stopped(ctx, time.Since(stopAt)); err != nil {
		return err
	}
	d.say("both hosts stopped (in %s) with %d checkouts asleep on their payment timers", time.Since(stopAt).Round(10*time.Millisecond), len(d.restart.sleeping))
	if err := d.waitTimersDue(ctx, time.Minute); err != nil {
		return err
	}
	d.restart.at = time.Now()
	_, stopHosts, err = d.startHosts(ctx, mailURL, faultDir)
	if err != nil {
		return err
	}
	waitErr := <-cancelled
	if waitErr == nil {
		waitErr = d.waitDone(ctx, 5*time.Minute)
	}
	elapsed := time.Since(start)
	stopKilling()
	stopHosts()
	if waitErr == nil {
		waitErr = d.payLate(ctx)
	}
	ok, err := d.summary(ctx, want, faultDir, elapsed)
	if err != nil {
		return err
	}
	if waitErr != nil {
		return waitErr
	}
	if !ok {
		return errors.New("demo: an invariant does not hold (see above)")
	}
	return nil
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

const (
	// demoDeployment is the demo's deployment (host setup --deployment):
	// its roles are its own, never the tests' or a real deployment's on
	// the same cluster; its owner role, the hosts' login, is
	// usher_<deployment>.
	demoDeployment = "demo"
	// demoAdminURL is --admin-url's default.
	demoAdminURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	// demoStream is the stream the demo's hosts share.
	demoStream = "usher:demo:{jobs}"
)

// demoDatabaseURL is the URL of the demo's database, usher_demo, on the
// server adminURL names: as the administrator, or logged in as the owner.
func demoDatabaseURL(adminURL string, asOwner bool) (string, error) {
	return databaseURLOf(adminURL, demoDatabase, demoDeployment, asOwner)
}

// demoDatabase is the demo's database; its test runs the demo on one of
// its own, in a deployment of its own.
const demoDatabase = "usher_demo"

// databaseURLOf is database name on adminURL's server, as the administrator
// or logged in as deployment's owner (usher_<deployment>).
func databaseURLOf(adminURL, name, deployment string, asOwner bool) (string, error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	if asOwner {
		u.User = url.User("usher_" + deployment)
	}
	return u.String(), nil
}

// inspectCommands are the commands that read the demo's state, as the demo
// prints them and the README shows them: it keeps its database and stream.
func inspectCommands(dbURL, stream string) []string {
	db := "--database-url " + shellQuote(dbURL)
	return []string{
		"bin/host inspect " + db + " --stream " + shellQuote(stream),
		"bin/host deadletters list " + db,
		"bin/host deadletters list --json " + db,
	}
}

// shellQuote quotes s for sh when it holds anything but plain characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// prepare makes a fresh database and stream and a clean work directory.
func (d *demo) prepare(ctx context.Context) error {
	if err := faults.RequireChaosBuilds(d.pluginDir, "counters", "tickets", "checkout"); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := os.RemoveAll(d.work); err != nil {
		return err
	}
	for _, sub := range []string{"blobs", "mail", "faults"} {
		if err := os.MkdirAll(filepath.Join(d.work, sub), 0o755); err != nil {
			return err
		}
	}
	admin, err := pgx.Connect(ctx, d.adminURL)
	if err != nil {
		return fmt.Errorf("demo: postgres at %s: %w (run `make services`)", d.adminURL, err)
	}
	defer admin.Close(ctx)
	db := pgx.Identifier{d.dbName}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return err
	}
	adminDemo, err := databaseURLOf(d.adminURL, d.dbName, d.deployment, false)
	if err != nil {
		return err
	}
	if d.dbURL, err = databaseURLOf(d.adminURL, d.dbName, d.deployment, true); err != nil {
		return err
	}
	// The administrator's one step (host setup): the runtime's owner, the
	// hosts' login, and the plugins' login roles. The hosts never run as
	// a superuser.
	demoAdmin, err := pgx.Connect(ctx, adminDemo)
	if err != nil {
		return err
	}
	defer demoAdmin.Close(ctx)
	if err := sandbox.Setup(ctx, demoAdmin, sandbox.SetupConfig{Deployment: d.deployment, Owner: "usher_" + d.deployment, Plugins: []string{"counters", "tickets", "checkout"}}); err != nil {
		return fmt.Errorf("demo: setup: %w", err)
	}
	if d.pool, err = pgxpool.New(ctx, d.dbURL); err != nil {
		return err
	}
	// Stagedoor's own tables (host migrate --stagedoor), before the hosts
	// install the plugins whose grants name them.
	if err := appdb.Migrate(ctx, d.pool); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if d.conn.redisURL, err = d.conn.redis(); err != nil {
		return err
	}
	opt, err := host.RedisOptions(d.conn.redisURL, d.conn.redisCAFile)
	if err != nil {
		return err
	}
	d.rdb = redis.NewClient(opt)
	d.conn.stream = d.stream
	if err := d.rdb.Del(ctx, d.conn.stream).Err(); err != nil {
		return fmt.Errorf("demo: redis at %s: %w (run `make services`)", host.MaskURL(d.conn.redisURL), err)
	}
	d.say("fresh database %s, stream %s, work dir %s", d.dbName, d.conn.stream, d.work)
	return nil
}

func (d *demo) startMailProvider() (string, func(), error) {
	logf, err := os.Create(filepath.Join(d.work, "mailprovider.log"))
	if err != nil {
		return "", nil, err
	}
	mp, err := mailproc.Start(d.mailBin, filepath.Join(d.work, "mail"), logf)
	if err != nil {
		logf.Close()
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	d.say("mail provider (pid %d) at %s", mp.Pid(), mp.URL)
	return mp.URL, func() {
		mp.Stop()
		logf.Close()
	}, nil
}

// startHosts runs two hosts in one consumer group, each with its own plugin
// processes, so a stalled entry is reclaimed by the other one.
func (d *demo) startHosts(ctx context.Context, mailURL, faultDir string) ([]*host.Host, func(), error) {
	var hosts []*host.Host
	var wg sync.WaitGroup
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var crashedOnce sync.Map
	for _, name := range []string{"host-a", "host-b"} {
		// Appended to: the demo restarts its hosts.
		logf, err := os.OpenFile(filepath.Join(d.work, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		cfg := host.Config{
			DatabaseURL: d.dbURL, RedisURL: d.conn.redisURL, RedisCAFile: d.conn.redisCAFile, Stream: d.conn.stream, Consumer: name,
			PluginDir: d.pluginDir, ReclaimIdle: d.reclaim, JobTimeout: 20 * time.Second,
			RetryBackoff: 500 * time.Millisecond, RelayPollInterval: 200 * time.Millisecond,
			// The demo crashes the tickets plugin on purpose, several times
			// a minute; in production five crashes a minute mark a plugin
			// unhealthy and its jobs wait for a fixed version.
			PluginCrashLoop: 50,
			// Every crash and kill above, and the restart, is a delivery
			// of each job in flight in that plugin or host; the demo's
			// crashes are many and close together, so a job may see more
			// than production's 10 before it ends.
			MaxDeliveries: 30,
			// The restart abandons what is in flight after 2s (left
			// unacked, reclaimed after the restart), as a host killed
			// would, rather than waiting out the stalls.
			ShutdownGrace: 2 * time.Second,
			PluginEnv: []string{
				faults.DirEnv + "=" + faultDir,
				"USHER_BLOB_DIR=" + filepath.Join(d.work, "blobs"),
				"MAILPROVIDER_URL=" + mailURL,
				"TICKETS_CLAIM_LEASE=" + d.lease.String(),
			},
			Logger: slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo})),
			// A batch holding every 100th outbox row: the relay "crashes" after publishing it
			// and before marking it, once, so it is published twice.
			RelayAfterPublish: func(ids []int64) error {
				for _, id := range ids {
					if id%100 == 0 {
						if _, dup := crashedOnce.LoadOrStore(id, true); !dup {
							d.relayDups.Add(int64(len(ids)))
							return fmt.Errorf("injected relay crash after publishing row %d", id)
						}
					}
				}
				return nil
			},
		}
		h, err := host.New(ctx, cfg)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		hosts = append(hosts, h)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer logf.Close()
			if err := h.Run(runCtx); err != nil {
				fmt.Fprintf(os.Stderr, "demo: %s: %v\n", name, err)
			}
		}()
		for _, p := range h.Plugins() {
			d.say("%s: plugin %s %s (pid %d) serves %v", name, p.Name, p.Version, p.Pid, p.Kinds)
		}
	}
	return hosts, func() {
		cancel()
		wg.Wait()
		for _, h := range hosts {
			h.Close()
		}
	}, nil
}

func (d *demo) placeOrders(ctx context.Context) (map[int64]int64, error) {
	rng := rand.New(rand.NewPCG(d.seed, 42))
	var events []int64
	for i, name := range []string{"Nils Frahm", "Kae Tempest", "Arooj Aftab", "Floating Points", "Hania Rani"} {
		id, err := orders.CreateEvent(ctx, d.pool, name, fmt.Sprintf("Hall %d", i+1))
		if err != nil {
			return nil, err
		}
		events = append(events, id)
	}
	want := map[int64]int64{}
	type o struct {
		ev    int64
		seats int
	}
	list := make([]o, d.orders)
	for i := range list {
		list[i] = o{events[rng.IntN(len(events))], 1 + rng.IntN(6)}
		want[list[i].ev] += int64(list[i].seats)
	}
	// The first two orders go first, so their outbox ids are the ones the
	// faults name.
	for i := range 2 {
		if _, err := orders.Place(ctx, d.pool, orders.Order{EventID: list[i].ev, Buyer: "Buyer " + strconv.Itoa(i), Email: fmt.Sprintf("buyer%d@example.com", i), Seats: list[i].seats}, orders.Jobs{Counter: true, Tickets: true}); err != nil {
			return nil, err
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 2 + w; i < len(list); i += 4 {
				if _, err := orders.Place(ctx, d.pool, orders.Order{EventID: list[i].ev, Buyer: "Buyer " + strconv.Itoa(i), Email: fmt.Sprintf("buyer%d@example.com", i), Seats: list[i].seats}, orders.Jobs{Counter: true, Tickets: true}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	d.say("placed %d orders over %d events (seed %d), each committing update_sales_counter and render_tickets in its transaction", d.orders, len(events), d.seed)
	return want, nil
}

// killWhenHeld waits until the plugin holds job, then kills it with -9.
func (d *demo) killWhenHeld(ctx context.Context, dir, point, job string) {
	hit := filepath.Join(dir, point+"."+job+".hit")
	for ctx.Err() == nil {
		raw, err := os.ReadFile(hit)
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
				d.pluginKills.Add(1)
				d.say("kill -9 of plugin pid %d while it held job %s", pid, job)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type progress struct {
	unpublished, scheduled, pending, counted, rendered, sent, running int64
	// open counts outbox rows without an outcome: an entry published and
	// not yet read by any consumer is in neither unpublished nor pending.
	open int64
}

func (d *demo) progress(ctx context.Context) (progress, error) {
	var p progress
	err := d.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox WHERE published_at IS NULL),
		(SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL),
		(SELECT count(*) FROM counter_applies),
		(SELECT count(DISTINCT order_id) FROM tickets WHERE pdf_key IS NOT NULL),
		(SELECT count(*) FROM plugin_tickets.email_sends WHERE sent_at IS NOT NULL),
		(SELECT count(*) FROM outbox WHERE done_at IS NULL),
		(SELECT count(*) FROM workflows WHERE state = 'running')`).
		Scan(&p.unpublished, &p.scheduled, &p.counted, &p.rendered, &p.sent, &p.open, &p.running)
	if err != nil {
		return p, err
	}
	if x, err := d.rdb.XPending(ctx, d.conn.stream, "usher").Result(); err == nil {
		p.pending = x.Count
	}
	return p, nil
}

func (d *demo) waitDone(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := time.Time{}
	n := int64(d.orders + len(d.plan.paid))
	for {
		p, err := d.progress(ctx)
		if err != nil {
			return err
		}
		if time.Since(last) > 2*time.Second {
			d.say("counted %d/%d, rendered %d/%d, sent %d/%d; checkouts running %d; pending %d, unpublished %d, scheduled %d",
				p.counted, n, p.rendered, n, p.sent, n, p.running, p.pending, p.unpublished, p.scheduled)
			last = time.Now()
		}
		if p.counted >= n && p.rendered >= n && p.sent >= n && p.running == 0 && p.pending == 0 && p.unpublished == 0 && p.scheduled == 0 && p.open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: not finished after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (d *demo) summary(ctx context.Context, want map[int64]int64, faultDir string, elapsed time.Duration) (bool, error) {
	ok := true
	w := tabwriter.NewWriter(d.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, "== sales counters (update_sales_counter, guard: job id recorded) ==")
	fmt.Fprintln(w, "event\texpected seats\tcounter\t")
	rows, err := d.pool.Query(ctx, `SELECT id, name, seats_sold FROM events ORDER BY id`)
	if err != nil {
		return false, err
	}
	err = forEach(rows, func(r pgx.Rows) error {
		var id, sold int64
		var name string
		if err := r.Scan(&id, &name, &sold); err != nil {
			return err
		}
		mark := ""
		if sold != want[id] {
			mark, ok = "  MISMATCH", false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", name, want[id], sold, mark)
		return nil
	})
	if err != nil {
		return false, err
	}
	w.Flush()

	n := int64(d.orders + len(d.plan.paid))
	var counterApplies, counterJobs, pdfOrders, sendQueued, sentRows, dead, outboxRows, unfinished, staleRetries int64
	if err := d.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM counter_applies),
		(SELECT count(DISTINCT job_id) FROM counter_applies),
		(SELECT count(DISTINCT order_id) FROM tickets WHERE pdf_key IS NOT NULL),
		(SELECT count(*) FROM outbox WHERE kind = 'send_tickets' AND job_id IS NULL),
		(SELECT count(*) FROM plugin_tickets.email_sends WHERE sent_at IS NOT NULL),
		(SELECT count(*) FROM dead_letters),
		(SELECT count(*) FROM outbox),
		(SELECT count(*) FROM outbox WHERE done_at IS NULL),
		(SELECT count(*) FROM outbox o WHERE o.outcome = 'retry_scheduled' AND EXISTS (SELECT 1 FROM outbox l
			WHERE coalesce(l.job_id, l.id::text) = coalesce(o.job_id, o.id::text) AND l.outcome IN ('applied', 'absorbed')))`).
		Scan(&counterApplies, &counterJobs, &pdfOrders, &sendQueued, &sentRows, &dead, &outboxRows, &unfinished, &staleRetries); err != nil {
		return false, err
	}
	store, err := blob.NewFS(filepath.Join(d.work, "blobs"))
	if err != nil {
		return false, err
	}
	pdfs, err := store.List(ctx, "tickets/")
	if err != nil {
		return false, err
	}
	msgs, err := d.mailer.Messages(ctx)
	if err != nil {
		return false, err
	}
	keys := map[string]int{}
	for _, m := range msgs {
		keys[m.IdempotencyKey]++
	}
	stats, _ := d.mailer.Stats(ctx)

	fmt.Fprintln(d.out)
	fmt.Fprintf(d.out, "== effects, per order (%d orders and %d paid checkouts) ==\n", d.orders, len(d.plan.paid))
	fmt.Fprintln(w, "effect\texpected\tfound\tlost\tdoubled\t")
	check := func(name string, found, distinct int64) {
		lost := max(n-distinct, 0)
		doubled := found - distinct
		if lost != 0 || doubled != 0 {
			ok = false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t\n", name, n, found, lost, doubled)
	}
	check("counter increments", counterApplies, counterJobs)
	check("stored ticket PDFs", int64(len(pdfs)), pdfOrders)
	check("send_tickets queued", sendQueued, min(sendQueued, n))
	check("emails at the provider", int64(len(msgs)), int64(len(keys)))
	check("email_sends marked sent", sentRows, sentRows)
	w.Flush()
	fmt.Fprintf(d.out, "outbox rows: %d, every one with an outcome: %v\n", outboxRows, unfinished == 0)
	if unfinished != 0 {
		ok = false
		fmt.Fprintf(d.out, "outbox rows without an outcome: %d\n", unfinished)
	}
	if staleRetries != 0 {
		// A row's outcome is its job's (migration 00030): none may say
		// retry_scheduled once the job applied.
		ok = false
		fmt.Fprintf(d.out, "outbox rows left at retry_scheduled after their job ended: %d\n", staleRetries)
	}
	if dead != 0 {
		ok = false
		fmt.Fprintf(d.out, "dead letters: %d (expected 0; see `%s`)\n", dead, inspectCommands(d.dbURL, d.conn.stream)[1])
	}

	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, "== faults injected ==")
	fmt.Fprintln(w, "fault\tcount\t")
	fmt.Fprintf(w, "relay crash between publish and mark (rows republished)\t%d\t\n", d.relayDups.Load())
	fmt.Fprintf(w, "kill -9 of a plugin mid-job\t%d\t\n", d.pluginKills.Load())
	fmt.Fprintf(w, "worker stalled past the reclaim threshold\t%d\t\n", countHits(faultDir, "render.after_check"))
	fmt.Fprintf(w, "plugin crash after the provider accepted, before sent_at\t%d\t\n", countHits(faultDir, "send.after_effect"))
	fmt.Fprintf(w, "mail provider 503 before sending\t%d\t\n", stats.FailedInjected)
	fmt.Fprintf(w, "kill -9 of the checkout plugin mid-reserve\t%d\t\n", d.reserveKills.Load())
	fmt.Fprintf(w, "checkout plugin crash after a release's commit phase\t%d\t\n", countHits(faultDir, "release.after_commit"))
	fmt.Fprintf(w, "both hosts restarted, checkouts asleep on their timers\t%d\t\n", len(d.restart.sleeping))
	w.Flush()
	outcomes, err := d.pool.Query(ctx, `SELECT coalesce(outcome, 'none'), count(*) FROM outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return false, err
	}
	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, "== outbox rows by outcome ==")
	if err := forEach(outcomes, func(r pgx.Rows) error {
		var o string
		var c int64
		if err := r.Scan(&o, &c); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%d\t\n", o, c)
		return nil
	}); err != nil {
		return false, err
	}
	w.Flush()
	// What the rows are: a job per kind per order (the send enqueued by
	// the render), and a row of its own for every retry, with the same
	// job id; every row of a job carries the job's latest outcome
	// (migration 00030), the attempts' own verdicts are in job_history.
	byKind, err := d.pool.Query(ctx, `SELECT kind, count(*), count(DISTINCT coalesce(job_id, id::text)) FROM outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return false, err
	}
	fmt.Fprintln(d.out)
	fmt.Fprintln(w, "kind\trows\tjobs\t")
	if err := forEach(byKind, func(r pgx.Rows) error {
		var kind string
		var rows, jobs int64
		if err := r.Scan(&kind, &rows, &jobs); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t\n", kind, rows, jobs)
		return nil
	}); err != nil {
		return false, err
	}
	w.Flush()
	fmt.Fprintln(d.out, "Each order makes one job of each kind (send_tickets is enqueued by its render); a paid checkout's render, count and")
	fmt.Fprintln(d.out, "send are its steps, and reserve_seats, release_seats and usher.workflow.checkout (its decision tasks) are the")
	fmt.Fprintln(d.out, "checkouts' own. A retry is a row of its own with")
	fmt.Fprintln(d.out, "the same job id, and every row of a job shows how the job ended: retry_scheduled only while it waits to run again.")
	fmt.Fprintln(d.out, "What each attempt did (a retry and why, then applied) is the job's history: `host jobs show ID`. absorbed is a")
	fmt.Fprintln(d.out, "row whose run found its effect already applied; the table below counts every duplicate absorbed, redeliveries of")
	fmt.Fprintln(d.out, "rows already done (relay republishes, reclaimed entries) included.")

	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, "== duplicates absorbed, per guard ==")
	fmt.Fprintln(w, "guard\tkind\treason\tcount\t")
	rows, err = d.pool.Query(ctx, `SELECT guard, kind, reason, count FROM absorbed_duplicates ORDER BY guard, kind, reason`)
	if err != nil {
		return false, err
	}
	if err := forEach(rows, func(r pgx.Rows) error {
		var g, kind, reason string
		var c int64
		if err := r.Scan(&g, &kind, &reason, &c); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t\n", g, kind, reason, c)
		return nil
	}); err != nil {
		return false, err
	}
	fmt.Fprintf(w, "provider key\tsend_tickets\tsame key replayed by the provider\t%d\t\n", stats.Replayed)
	w.Flush()
	cok, err := d.checkoutSummary(ctx, w)
	if err != nil {
		return false, err
	}
	ok = ok && cok
	fmt.Fprintln(d.out)
	verdict := "OK: nothing lost, nothing doubled"
	if !ok {
		verdict = "FAILED: an invariant does not hold"
	}
	fmt.Fprintf(d.out, "%d orders and %d checkouts in %s. %s. Logs: %s/host-a.log, %s/host-b.log\n", d.orders, d.checkouts, elapsed.Round(100*time.Millisecond), verdict, d.work, d.work)
	fmt.Fprintln(d.out, "The demo's database and stream stay until the next run; to look at them:")
	for _, c := range inspectCommands(d.dbURL, d.conn.stream) {
		fmt.Fprintln(d.out, "  "+c)
	}
	return ok, nil
}

func countHits(dir, point string) int {
	m, _ := filepath.Glob(filepath.Join(dir, point+".*.hit"))
	return len(m)
}

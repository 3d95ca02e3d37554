// Package hosttest is the kit usher's own tests use against real Postgres,
// real Redis and real plugin processes: a fresh database per test, a unique
// stream key, plugin binaries built from source, and a running host that
// stops when the test ends.
package hosttest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/doctest"
	"github.com/usherhq/usher/internal/entry"
	"github.com/usherhq/usher/migrations"
	"github.com/usherhq/usher/plugins/checkout/checkout"
	"github.com/usherhq/usher/plugins/stagedoor/appdb"
)

// DatabaseURL is the server tests create their databases on
// (USHER_TEST_DATABASE_URL, default the local "test" database).
func DatabaseURL() string {
	if s := os.Getenv("USHER_TEST_DATABASE_URL"); s != "" {
		return s
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// RedisURL is the Redis tests use (USHER_TEST_REDIS_URL, default local).
func RedisURL() string {
	if s := os.Getenv("USHER_TEST_REDIS_URL"); s != "" {
		return s
	}
	return "redis://127.0.0.1:6379/0"
}

// Suffix returns a short random suffix for names.
func Suffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The names the tests give the cluster's roles and their databases,
// configurable for a cluster shared with others (sdktest run against a
// team's server, two checkouts' tests at once):
//
//   - Deployment (USHER_TEST_DEPLOYMENT, default none) is the deployment
//     the tests' roles belong to (sandbox.SetupConfig.Deployment): plugin
//     roles usher_<deployment>_plugin_<name>, recorded on every database
//     the tests create;
//   - Owner (USHER_TEST_OWNER, default usher_test_owner, or
//     usher_<deployment>_test_owner) is the runtime's owner role the
//     tests' hosts log in as: no superuser, as in production (host.New
//     refuses a superuser);
//   - DatabasePrefix (USHER_TEST_DATABASE_PREFIX, default usher_t_)
//     begins the name of every database a test creates.
var (
	Deployment     = os.Getenv("USHER_TEST_DEPLOYMENT")
	Owner          = envOr("USHER_TEST_OWNER", testOwner(Deployment))
	DatabasePrefix = envOr("USHER_TEST_DATABASE_PREFIX", "usher_t_")
)

func testOwner(deployment string) string {
	if deployment == "" {
		return "usher_test_owner"
	}
	return "usher_" + deployment + "_test_owner"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// PluginRole is plugin name's login role in the tests' Deployment.
func PluginRole(name string) string { return sandbox.PluginRoleIn(Deployment, name) }

// PluginNames are the plugins the tests load; DB makes sure each has its
// login role (roles are cluster-wide: created once, kept).
var PluginNames = []string{"counters", "tickets", "raw", "rolecheck", "flaky", "hostile", "sdktest", "fanout", "lateload", "flows", "checkout"}

var rolesOnce sync.Once

// EnsureRoles creates the owner and the named plugins' login roles, as the
// administrator of DatabaseURL, with sandbox.Setup. Test packages running
// at once take turns (Setup serialises itself).
func EnsureRoles(tb testing.TB, plugins ...string) {
	tb.Helper()
	ctx := context.Background()
	admin := adminConn(tb)
	defer admin.Close(ctx)
	// Made and marked already (by this run's first test binary, or an
	// earlier run): no Setup again. Setup would set every role's
	// CONNECTION LIMIT anew, under a test of another binary that changed
	// one of them on purpose (TestPluginLoadRetriedAfterTransientRefusal).
	roles := []string{Owner}
	for _, p := range plugins {
		roles = append(roles, sandbox.PluginRoleIn(Deployment, p), sandbox.SchemaRoleIn(Deployment, p))
	}
	var marked int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)
		AND shobj_description(oid, 'pg_authid') LIKE 'usher deployment %'`, roles).Scan(&marked); err == nil && marked == len(roles) {
		return
	}
	// The tests' databases share these roles (each is created by the
	// owner and granted to the plugin roles): adopted as the test
	// deployment's, with no connection limit, since test binaries run at
	// once on one cluster. In a named deployment the database connected
	// to is only where the administrator logs in (its plugin schemas are
	// the default deployment's): EmptyDB records the deployment on each
	// database it creates, and installs make their schemas there.
	if err := sandbox.Setup(ctx, admin, sandbox.SetupConfig{Deployment: Deployment, Owner: Owner, Plugins: plugins,
		PluginConnectionLimit: -1, Adopt: true, RolesOnly: Deployment != ""}); err != nil {
		tb.Fatalf("hosttest: roles: %v", err)
	}
}

// adminConn connects as the administrator of DatabaseURL; the caller
// closes it.
func adminConn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	admin, err := pgx.Connect(context.Background(), DatabaseURL())
	if err != nil {
		tb.Fatalf("hosttest: postgres: %v", err)
	}
	return admin
}

// DB creates a fresh database owned by Owner, migrated, for the test and
// drops it when the test ends. It returns a pool logged in as Owner (the
// host's login; it owns every table) and the database's URL for Owner.
//
// In a test binary whose TestMain is Main, the database is a copy of a
// template migrated once for the binary (CREATE DATABASE ... TEMPLATE),
// which is several times cheaper than migrating each anew; elsewhere it is
// migrated itself. Both hold the same: every migration, the application's
// tables and the shipped plugins' schemas and grants.
func DB(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	if !templates.enabled {
		pool, dbURL := EmptyDB(tb)
		migrate(tb, pool)
		return pool, dbURL
	}
	tpl := templates.get(tb)
	return newDB(tb, tpl)
}

// migrate brings an empty database to what DB returns.
func migrate(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	if err := migrations.Up(ctx, pool); err != nil {
		tb.Fatalf("hosttest: migrate: %v", err)
	}
	// The application's tables, then the shipped plugins' schemas and
	// grants, as `host migrate --stagedoor` and `host plugins install`
	// make them: tests that load a plugin by path (no manifest) find
	// them in place, and those that load from a manifest written with
	// AddShipped install the same, a no-op.
	if err := appdb.Migrate(ctx, pool); err != nil {
		tb.Fatalf("hosttest: stagedoor: %v", err)
	}
	for _, name := range Shipped {
		if _, err := plugindb.Install(ctx, pool, ShippedSpec(tb, name)); err != nil {
			tb.Fatalf("hosttest: %v", err)
		}
	}
	// The raw test plugin's default commit writes the events counter.
	for _, p := range []string{"raw", "flaky"} {
		if _, err := pool.Exec(ctx, `GRANT SELECT (id, seats_sold), UPDATE (seats_sold) ON events TO `+PluginRole(p)); err != nil {
			tb.Fatalf("hosttest: grant: %v", err)
		}
	}
}

// Main runs a test binary's tests (call it from the package's TestMain)
// with DB copying one migrated template instead of migrating every
// database, and drops the template when the tests end.
func Main(m *testing.M) {
	sweepOrphans()
	templates.enabled = true
	code := m.Run()
	templates.drop()
	os.Exit(code)
}

// templates is the test binary's migrated template database, made by the
// first DB that needs it.
var templates templateDB

type templateDB struct {
	enabled bool
	mu      sync.Mutex
	name    string
}

// get returns the template's name, making it first if there is none yet.
// A test that fails while making it (tb.Fatal) leaves none behind: the
// next DB tries again.
func (t *templateDB) get(tb testing.TB) string {
	tb.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.name != "" {
		return t.name
	}
	name := DatabasePrefix + "tpl_" + Suffix()
	made := false
	defer func() {
		if !made {
			dropDatabase(name)
		}
	}()
	pool, _ := createDB(tb, name, "")
	defer pool.Close()
	migrate(tb, pool)
	// A database is copied only while nobody else is connected to it:
	// none may connect from now on (autovacuum's routine visits
	// included). Copies allow connections (CREATE DATABASE's default).
	pool.Close()
	ctx := context.Background()
	admin := adminConn(tb)
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH ALLOW_CONNECTIONS false"); err != nil {
		tb.Fatalf("hosttest: template: %v", err)
	}
	made, t.name = true, name
	return name
}

// madeByPrefix begins the comment createDB puts on each database: the
// process that made it and the machine it ran on.
const madeByPrefix = "usher hosttest: pid "

func madeBy() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s%d on %s", madeByPrefix, os.Getpid(), host)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// sweepOrphans drops the databases (tests' and templates) that a test
// binary killed before its cleanup (by -timeout, or kill -9) left behind:
// those whose comment names a process of this machine that no longer
// exists. A database made on another machine sharing the server, or by a
// live process, is left alone. Best effort: a server it cannot reach is
// the first test's to report.
func sweepOrphans() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, DatabaseURL())
	if err != nil {
		return
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database
		WHERE starts_with(datname, $1) AND starts_with(shobj_description(oid, 'pg_database'), $2)`, DatabasePrefix, madeByPrefix)
	if err != nil {
		return
	}
	type made struct{ Name, By string }
	found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[made])
	if err != nil {
		return
	}
	host, _ := os.Hostname()
	for _, d := range found {
		var pid int
		var on string
		if _, err := fmt.Sscanf(strings.TrimPrefix(d.By, madeByPrefix), "%d on %s", &pid, &on); err != nil || on != host {
			continue
		}
		if processGone(pid) {
			dropDatabase(d.Name)
		}
	}
}

// processGone reports whether no process pid exists on this machine.
func processGone(pid int) bool {
	return pid > 0 && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// drop drops the template, if one was made.
func (t *templateDB) drop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.name != "" {
		dropDatabase(t.name)
		t.name = ""
	}
}

// EmptyDB creates a fresh database owned by Owner, with nothing in it, for
// the test and drops it when the test ends; it returns what DB does.
func EmptyDB(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	return newDB(tb, "")
}

// newDB creates a database for the test, a copy of template (the server's
// default when empty), and drops it when the test ends.
func newDB(tb testing.TB, template string) (*pgxpool.Pool, string) {
	tb.Helper()
	name := DatabasePrefix + Suffix()
	pool, dbURL := createDB(tb, name, template)
	tb.Cleanup(func() {
		pool.Close()
		dropDatabase(name)
	})
	return pool, dbURL
}

// createDB creates database name owned by Owner, a copy of template when
// one is given, records the tests' deployment on it (a per-database
// setting, which a copy does not carry) and returns a pool on it logged in
// as Owner, and its URL. The caller drops it.
func createDB(tb testing.TB, name, template string) (*pgxpool.Pool, string) {
	tb.Helper()
	rolesOnce.Do(func() { EnsureRoles(tb, PluginNames...) })
	ctx := context.Background()
	admin := adminConn(tb)
	defer admin.Close(ctx)
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " OWNER " + pgx.Identifier{Owner}.Sanitize()
	if template != "" {
		create += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := admin.Exec(ctx, create); err != nil {
		tb.Fatalf("hosttest: create database: %v", err)
	}
	// Whose it is, for the sweep of a later binary (sweepOrphans) should
	// this one be killed before it drops it.
	if _, err := admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" IS "+quoteLiteral(madeBy())); err != nil {
		dropDatabase(name)
		tb.Fatalf("hosttest: mark the database: %v", err)
	}
	if Deployment != "" {
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET "+sandbox.DeploymentSetting+" = '"+Deployment+"'"); err != nil {
			dropDatabase(name)
			tb.Fatalf("hosttest: record the deployment: %v", err)
		}
	}
	u, err := url.Parse(DatabaseURL())
	if err != nil {
		dropDatabase(name)
		tb.Fatalf("hosttest: database url: %v", err)
	}
	u.Path = "/" + name
	u.User = url.User(Owner)
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		dropDatabase(name)
		tb.Fatalf("hosttest: %v", err)
	}
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		dropDatabase(name)
		tb.Fatalf("hosttest: pool: %v", err)
	}
	return pool, u.String()
}

// dropDatabase drops database name, ending its sessions. Errors are
// ignored: it is cleanup.
func dropDatabase(name string) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, DatabaseURL())
	if err != nil {
		return
	}
	defer c.Close(ctx)
	_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Shipped are the plugins this repository ships, whose schema and grants
// live in plugins/<name>/db: migrations/ (none for counters) and
// grants.json, the files `make plugins` writes into their manifests.
var Shipped = []string{"counters", "tickets", "checkout"}

// ShippedSpec is the install of shipped plugin name from its source
// files, as its manifest would carry them.
func ShippedSpec(tb testing.TB, name string) plugindb.Spec {
	tb.Helper()
	dir := filepath.Join(usherRoot(tb), "plugins", name, "db")
	file := filepath.Join(dir, "grants.json")
	// The tests run the chaos builds: a chaos build that writes more than
	// the shipped plugin (counters' counter_applies) declares its own.
	if chaos := filepath.Join(usherRoot(tb), "plugins", name, "chaos", "grants.json"); fileExists(chaos) {
		file = chaos
	}
	grants, err := pluginhost.ReadGrants(file)
	if err != nil {
		tb.Fatalf("hosttest: %v", err)
	}
	spec := plugindb.Spec{Name: name, Version: "source", Grants: grants}
	if _, err := os.Stat(filepath.Join(dir, "migrations")); err == nil {
		spec.Migrations = os.DirFS(filepath.Join(dir, "migrations"))
		if spec.MigrationsSHA256, err = pluginhost.MigrationsSHA256(spec.Migrations); err != nil {
			tb.Fatalf("hosttest: %v", err)
		}
	}
	return spec
}

// AddShipped completes m, a manifest about to be written into dir, with
// its plugin's migrations (copied into dir as <name>-migrations) and
// grants when it is one of Shipped, as `make plugins` does; other
// manifests are left as they are.
func AddShipped(tb testing.TB, m *pluginhost.FileManifest, dir string) {
	tb.Helper()
	if !slices.Contains(Shipped, m.Name) {
		return
	}
	spec := ShippedSpec(tb, m.Name)
	m.Grants = spec.Grants
	if spec.Migrations == nil {
		return
	}
	m.Migrations, m.MigrationsSHA256 = m.Name+"-migrations", spec.MigrationsSHA256
	if err := os.RemoveAll(filepath.Join(dir, m.Migrations)); err != nil {
		tb.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(dir, m.Migrations), spec.Migrations); err != nil {
		tb.Fatalf("hosttest: copy %s's migrations: %v", m.Name, err)
	}
}

// AdminURL is dbURL (one of DB's) for the administrator of DatabaseURL:
// for the few tests that must act as a superuser would.
func AdminURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	a, err := url.Parse(DatabaseURL())
	if err != nil {
		tb.Fatal(err)
	}
	u.User = a.User
	return u.String()
}

// Redis returns a client and a stream key unique to the test; the key,
// its shards' keys (stream.ShardKey) and every key derived from them are
// deleted when the test ends.
func Redis(tb testing.TB) (*redis.Client, string) {
	tb.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		tb.Fatalf("hosttest: redis url: %v", err)
	}
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("hosttest: redis: %v", err)
	}
	suffix := Suffix()
	key := "usher:test:{" + suffix + "}"
	tb.Cleanup(func() {
		ctx := context.Background()
		_ = rdb.Del(ctx, key).Err()
		iter := rdb.Scan(ctx, 0, "usher:test:{"+suffix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = rdb.Del(ctx, iter.Val()).Err()
		}
		_ = rdb.Close()
	})
	return rdb, key
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// ModuleRoot finds the directory holding go.mod.
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	return doctest.Root(tb)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// usherRoot is this module's root, found from this file: the shipped
// plugins' files are there whichever module's test runs (a third party's
// sdktest runs in its own module, where ModuleRoot is not usher's).
func usherRoot(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("hosttest: cannot locate the usher module")
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Build compiles the main package pkg (relative to the module root, e.g.
// "./plugins/counters") with optional -ldflags -X settings, once per test
// binary, and returns the executable's path under bin/test.
func Build(tb testing.TB, pkg string, xflags ...string) string {
	tb.Helper()
	key := pkg + "|" + strings.Join(xflags, " ")
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[key]; ok {
		return p
	}
	root := ModuleRoot(tb)
	name := strings.NewReplacer("./", "", "/", "_").Replace(pkg)
	if len(xflags) > 0 {
		name += "_" + Suffix()
	}
	out := filepath.Join(root, "bin", "test", name)
	args := []string{"build", "-o", out}
	if len(xflags) > 0 {
		var ld []string
		for _, x := range xflags {
			ld = append(ld, "-X "+x)
		}
		args = append(args, "-ldflags", strings.Join(ld, " "))
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("hosttest: go build %s: %v\n%s", pkg, err, b)
	}
	built[key] = out
	return out
}

// SigningKey returns the stream signing key of the test's database (the one
// a host started on it without Config.SigningKey uses), generating it if no
// host has yet.
func SigningKey(tb testing.TB, pool *pgxpool.Pool) []byte {
	tb.Helper()
	key, err := outbox.LoadSigningKey(context.Background(), pool)
	if err != nil {
		tb.Fatalf("hosttest: %v", err)
	}
	return key
}

// Signed returns the XADD values vals (field, value pairs) followed by
// their signature by key, as a relay would sign them: for tests that add
// raw entries which are meant to be valid in every way but one other than
// their origin (malformed, unknown kind, oversized). A field missing from
// vals is signed as empty, as the consumer reads it.
func Signed(key []byte, vals ...any) []any {
	m := make(map[string]any, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		k, _ := vals[i].(string)
		m[k] = vals[i+1]
	}
	return append(append([]any(nil), vals...), entry.FieldSig, entry.FieldsOf(m).Sign(key))
}

// Logger returns a logger that writes through t.Log (only shown for failing
// or verbose tests) at level.
func Logger(tb testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: level}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Running is a host running in the test.
type Running struct {
	*host.Host
	// AdminToken is the admin API's token when cfg.AdminAddr was set.
	AdminToken string
	cancel     context.CancelFunc
	done       chan error
	once       sync.Once
	err        error
}

// Stop stops the host and waits for Run to return. It may be called again
// (the test's cleanup does); later calls return the first result.
func (r *Running) Stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
		r.Close()
	})
	return r.err
}

// Start builds a host from cfg (tests fill DatabaseURL/Pool, Redis and
// Stream) and runs it until the test ends or Stop is called. With an
// AdminAddr and no admin token given, the token file is the test's own
// (never the user's default file).
func Start(tb testing.TB, cfg host.Config) *Running {
	tb.Helper()
	if cfg.AdminAddr != "" && cfg.AdminToken == "" && cfg.AdminTokenFile == "" {
		cfg.AdminTokenFile = filepath.Join(tb.TempDir(), "admin-token")
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger(tb, slog.LevelWarn)
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "test-" + Suffix()
	}
	ctx, cancel := context.WithCancel(context.Background())
	h, err := host.New(ctx, cfg)
	if err != nil {
		cancel()
		tb.Fatalf("hosttest: new host: %v", err)
	}
	r := &Running{Host: h, AdminToken: cfg.AdminToken, cancel: cancel, done: make(chan error, 1)}
	if cfg.AdminAddr != "" && r.AdminToken == "" {
		if r.AdminToken, err = admin.ReadTokenFile(cfg.AdminTokenFile); err != nil {
			cancel()
			h.Close()
			tb.Fatalf("hosttest: %v", err)
		}
	}
	go func() { r.done <- h.Run(ctx) }()
	tb.Cleanup(func() { _ = r.Stop() })
	return r
}

// Eventually polls cond every 50ms until it holds or timeout passes.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("hosttest: timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pending returns the number of entries pending in the group.
func Pending(tb testing.TB, rdb redis.UniversalClient, stream, group string) int64 {
	tb.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// Count runs a COUNT-style query returning one integer.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("hosttest: %s: %v", sql, err)
	}
	return n
}

// MailProvider builds and starts cmd/mailprovider as its own process on a
// free port with a fresh data directory, and returns its URL. The process
// is killed when the test ends.
func MailProvider(tb testing.TB) string {
	tb.Helper()
	bin := Build(tb, "./cmd/mailprovider")
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-data", tb.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("hosttest: start mail provider: %v", err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		tb.Fatalf("hosttest: mail provider did not start: %v", err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "mailprovider listening on "))
}

// RawPool serves kind raw_job to the raw plugin's role in owner's database
// (sandbox.Prepare) and opens that role's pool as the host would
// (sandbox.OpenPluginPool), size connections, closed when tb ends: the
// plugin side of the runtime, with no plugin process.
func RawPool(tb testing.TB, owner *pgxpool.Pool, size int32) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	if err := sandbox.Prepare(ctx, owner, "raw", "usher_plugin_raw", []string{"raw_job"}, nil); err != nil {
		tb.Fatalf("hosttest: serve raw_job to usher_plugin_raw: %v", err)
	}
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: owner.Config(), Role: "usher_plugin_raw", Size: size})
	if err != nil {
		tb.Fatalf("hosttest: usher_plugin_raw's pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// ParseWriter creates, in owner's database, a table <name>_effects and a
// domain <name>_dom whose check inserts a row into it, both usable by
// role: a cast of a literal to an array of the domain ('{1}'::<name>_dom[])
// writes while the server parses the statement. For the tests that
// plugin code run at parse time writes nothing outside a job's
// transaction (or a read-only phase's).
func ParseWriter(tb testing.TB, owner *pgxpool.Pool, name, role string) {
	tb.Helper()
	t, fn, dom := pgx.Identifier{name + "_effects"}.Sanitize(), pgx.Identifier{name + "_sneak"}.Sanitize(), pgx.Identifier{name + "_dom"}.Sanitize()
	r := pgx.Identifier{role}.Sanitize()
	_, err := owner.Exec(context.Background(), fmt.Sprintf(`
		CREATE TABLE %[1]s (n int);
		CREATE FUNCTION %[2]s(n int) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO %[1]s VALUES (n);
			RETURN true;
		END $$;
		CREATE DOMAIN %[3]s AS int CHECK (%[2]s(VALUE));
		GRANT SELECT, INSERT ON %[1]s TO %[4]s;
		GRANT USAGE ON DOMAIN %[3]s TO %[4]s`, t, fn, dom, r))
	if err != nil {
		tb.Fatalf("hosttest: a domain that writes at parse time: %v", err)
	}
}

// PluginUsers creates an OS user of its own for each plugin name, as `host
// setup-users` does, under a pattern unique to the test
// ("ut<random>-{name}", for Config.PluginUser), and deletes them (and their
// groups) when the test ends. The test must run as root.
func PluginUsers(tb testing.TB, names ...string) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatalf("hosttest: creating plugin users needs root; the tests run as root (uid %d here)", os.Geteuid())
	}
	pattern := "ut" + Suffix()[:8] + "-" + pluginhost.NamePlaceholder
	for _, n := range names {
		u := pluginhost.UserFor(pattern, n)
		created, err := pluginhost.UserAdd(u)
		if err != nil {
			tb.Fatalf("hosttest: %v", err)
		}
		if !created {
			tb.Fatalf("hosttest: OS user %s exists already", u)
		}
		tb.Cleanup(func() {
			if err := pluginhost.UserDel(u); err != nil {
				tb.Errorf("hosttest: %v", err)
			}
		})
	}
	return pattern
}

// SharedBinary copies the executable at path into a directory every user
// may read and run files in (a test's temporary directory is its own) as
// name, for a plugin that runs as another OS user, and returns its path.
func SharedBinary(tb testing.TB, path, name string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "usher-plugin-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(dir, name)
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// ChaosPlugins builds the shipped plugins' chaos builds (counters, tickets,
// checkout) into a fresh plugin directory with their manifests, as `make
// chaos-plugins` does: each binary's kinds, migrations and grants, and the
// checkout's enqueues (the other plugins' kinds its workflow schedules).
// It returns the directory, for host.Config.PluginDir.
func ChaosPlugins(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	for _, name := range []string{"counters", "tickets", "checkout"} {
		InstallChaosPlugin(tb, dir, name, "1.0.0")
	}
	return dir
}

// InstallChaosPlugin writes the chaos build of shipped plugin name, built
// as version, and its manifest into dir (over what is there): a host
// watching dir, or asked to reload it, swaps to it.
func InstallChaosPlugin(tb testing.TB, dir, name, version string) {
	tb.Helper()
	kinds := map[string][]string{"counters": {"update_sales_counter"}, "tickets": {"render_tickets", "send_tickets"},
		"checkout": checkout.Kinds}[name]
	var enqueues []string
	if name == "checkout" {
		enqueues = checkout.Enqueues
	}
	var xflags []string
	if version != "1.0.0" { // the builds' default: the other tests' builds serve
		xflags = []string{"main.version=" + version}
	}
	src, err := os.ReadFile(Build(tb, "./plugins/"+name+"/chaos", xflags...))
	if err != nil {
		tb.Fatal(err)
	}
	// A new file, renamed over the old one: a running copy is not written.
	tmp := filepath.Join(dir, "."+name+".new")
	if err := os.WriteFile(tmp, src, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		tb.Fatal(err)
	}
	m, err := pluginhost.NewFileManifest(filepath.Join(dir, name), name, version, kinds)
	if err != nil {
		tb.Fatalf("hosttest: %v", err)
	}
	AddShipped(tb, &m, dir)
	m.Enqueues = enqueues
	if _, err := m.Write(dir); err != nil {
		tb.Fatalf("hosttest: %v", err)
	}
}

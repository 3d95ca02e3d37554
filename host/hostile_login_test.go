package host_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// A plugin that logs in by itself where the server lets it (trust
// authentication on the host's machine, which the README's first security
// paragraph warns of and `host run` warns at start) floods the server with
// sessions of its own: its role's CONNECTION LIMIT caps what it gets, so
// the application's enqueues and the other plugins' jobs go on. Before,
// it took as many as the server had (47, and the server refused everyone
// else).
func TestHostileConnectionFlood(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A role of its own, so the flood meets no other test's sessions.
	name := "hostile_" + hosttest.Suffix()
	role := sandbox.PluginRole(name)
	const limit = 3
	owner := "usher_o" + hosttest.Suffix()
	admin, err := pgx.Connect(ctx, hosttest.DatabaseURL())
	require.NoError(t, err)
	t.Cleanup(func() { // after the database is dropped
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role+", "+sandbox.SchemaRole(name)+", "+owner)
		_ = admin.Close(context.Background())
	})
	b := setup(t)
	// As `host setup --plugin NAME --plugin-connection-limit 3` makes it.
	dbAdmin, err := pgx.Connect(ctx, hosttest.AdminURL(t, b.dbURL))
	require.NoError(t, err)
	err = sandbox.Setup(ctx, dbAdmin, sandbox.SetupConfig{Owner: owner, Plugins: []string{name}, PluginConnectionLimit: limit})
	require.NoError(t, dbAdmin.Close(ctx))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `CREATE TABLE hostile_effects (job_id text NOT NULL, n int NOT NULL DEFAULT 0);
		GRANT SELECT, INSERT, UPDATE ON hostile_effects TO `+role)
	require.NoError(t, err)
	dsn, err := url.Parse(b.dbURL)
	require.NoError(t, err)
	dsn.User = url.User(role)

	hb := &hostileBundle{testBundle: b, bin: hosttest.Build(t, "./host/testdata/hostileplugin")}
	ids, _ := hb.enqueue(t, []hostileCase{{kind: "hostile_apply", name: "flood"}})
	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, hb.bin)
	cfg.PluginEnv = append(cfg.PluginEnv, "HOSTILE_NAME="+name, "HOSTILE_DSN="+dsn.String())
	cfg.PluginPoolSize = 1
	h := hosttest.Start(t, cfg)

	// While it holds what it got, the application enqueues and the
	// counters plugin applies.
	watch, err := pgxpool.New(ctx, hosttest.AdminURL(t, b.dbURL))
	require.NoError(t, err)
	defer watch.Close()
	hosttest.Eventually(t, 30*time.Second, "the flood's sessions", func() bool {
		return hosttest.Count(t, watch, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role) >= limit-1
	})
	want := b.placeOrders(t, 10, 2)
	hosttest.Eventually(t, 60*time.Second, "the counters applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 10
	})
	b.requireCounters(t, want)
	hosttest.Eventually(t, 30*time.Second, "the flood job applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = $1`, ids[0]) == 1
	})
	got := hosttest.Count(t, b.pool, `SELECT n FROM hostile_effects WHERE job_id = $1`, ids[0])
	require.LessOrEqual(t, got, int64(limit), "sessions the plugin opened by itself")
	for _, p := range h.Plugins() {
		require.True(t, p.Healthy, p.Name)
	}
}

// logWatch is a logger that also hands every record whose message begins
// with prefix to a channel.
type logWatch struct {
	slog.Handler
	prefix string
	got    chan string
}

func (w logWatch) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, w.prefix) {
		select {
		case w.got <- r.Message:
		default: // the test has what it reads
		}
	}
	return w.Handler.Handle(ctx, r)
}

func (w logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return logWatch{w.Handler.WithAttrs(as), w.prefix, w.got}
}

func (w logWatch) WithGroup(g string) slog.Handler {
	return logWatch{w.Handler.WithGroup(g), w.prefix, w.got}
}

// The README's production setup (`host setup --passfile`, scram-sha-256 on
// every pg_hba line): a plugin sets its own role's password, by the
// statement or from a DO block, then logs in with it to hold a row lock of
// the application's outside any host transaction. The change is refused
// and rolled back, so the login fails, no lock is held, and the
// counters on that row apply. Before, the password stuck, the plugin logged
// in, and every job on the row waited for as long as it liked.
//
// Not parallel: the passfile reaches the host through PGPASSFILE.
func TestHostileOwnPassword(t *testing.T) {
	cluster := hosttest.StartCluster(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, cluster.AdminURL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE stagedoor")
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))

	passfile := filepath.Join(t.TempDir(), "pgpass")
	hostBin := hosttest.Build(t, "./cmd/host")
	// The administrator's password in PGPASSWORD: a command line holding
	// one is refused (every local user reads /proc/PID/cmdline).
	setup := exec.Command(hostBin, "setup", "--admin-url", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/stagedoor?sslmode=disable", cluster.Port),
		"--plugin", "counters", "--plugin", "hostile", "--passfile", passfile)
	setup.Env = append(os.Environ(), "PGPASSWORD="+cluster.AdminPassword)
	out, err := setup.CombinedOutput()
	require.NoError(t, err, "%s", out)
	ownerURL := fmt.Sprintf("postgres://usher@127.0.0.1:%d/stagedoor?sslmode=disable", cluster.Port)
	t.Setenv("PGPASSFILE", passfile)
	out, err = exec.Command(hostBin, "migrate", "--stagedoor", "--database-url", ownerURL).CombinedOutput()
	require.NoError(t, err, "%s", out)
	pool, err := pgxpool.New(ctx, ownerURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = plugindb.Install(ctx, pool, hosttest.ShippedSpec(t, "counters"))
	require.NoError(t, err)
	// setup's default CONNECTION LIMIT.
	require.EqualValues(t, sandbox.DefaultPluginConnectionLimit,
		hosttest.Count(t, pool, `SELECT rolconnlimit FROM pg_roles WHERE rolname = 'usher_plugin_hostile'`))
	_, err = pool.Exec(ctx, `CREATE TABLE hostile_effects (job_id text NOT NULL, n int NOT NULL DEFAULT 0);
		GRANT SELECT, INSERT, UPDATE ON hostile_effects TO usher_plugin_hostile;
		GRANT SELECT (id), UPDATE (seats_sold) ON events TO usher_plugin_hostile`)
	require.NoError(t, err)
	event, err := orders.CreateEvent(ctx, pool, "Event 1", "Stagedoor Hall")
	require.NoError(t, err)
	require.EqualValues(t, 1, event, "the event the plugin would lock")

	// Password authentication: the host's check finds no way in without
	// one (host run warns when there is).
	cc, err := pgx.ParseConfig(ownerURL)
	require.NoError(t, err)
	open, err := sandbox.LogsInWithoutPassword(ctx, cc, "usher_plugin_hostile")
	require.NoError(t, err)
	require.False(t, open)

	rdb, stream := hosttest.Redis(t)
	b := &hostileBundle{testBundle: &testBundle{pool: pool, rdb: rdb, stream: stream}, bin: hosttest.Build(t, "./host/testdata/hostileplugin")}
	ids, _ := b.enqueue(t, []hostileCase{{kind: "hostile_apply", name: "own-password"}, {kind: "hostile_apply", name: "own-password-do"}})
	watch := logWatch{Handler: hosttest.Logger(t, slog.LevelWarn).Handler(), prefix: "hostile:", got: make(chan string, 4)}
	hosttest.Start(t, host.Config{DatabaseURL: ownerURL, Redis: rdb, Stream: stream,
		Plugins: []string{hosttest.Build(t, "./plugins/counters"), b.bin}, MaxAttempts: 1,
		PluginEnv:   []string{fmt.Sprintf("HOSTILE_DSN=postgres://usher_plugin_hostile@127.0.0.1:%d/stagedoor?sslmode=disable", cluster.Port)},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, Logger: slog.New(watch)})

	hosttest.Eventually(t, 60*time.Second, "both attacks dead-lettered", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = ANY($1)`, ids) == 2
	})
	for _, id := range ids {
		var reason string
		require.NoError(t, pool.QueryRow(ctx, `SELECT reason FROM dead_letters WHERE job_id = $1`, id).Scan(&reason))
		require.Regexp(t, "may not run ALTER ROLE|changed a role, its password or settings", reason)
	}
	for range ids {
		select {
		case msg := <-watch.got:
			require.Contains(t, msg, "hostile: no direct login: ", msg)
			require.Contains(t, msg, "password authentication failed")
		case <-time.After(60 * time.Second):
			t.Fatal("the plugin did not say how its logins went")
		}
	}
	_, err = pgx.Connect(ctx, fmt.Sprintf("postgres://usher_plugin_hostile:hostile@127.0.0.1:%d/stagedoor?sslmode=disable", cluster.Port))
	require.ErrorContains(t, err, "password authentication failed")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM hostile_effects WHERE job_id = 'direct-login'`))

	// Nothing holds event 1: its counters apply.
	for range 5 {
		_, err := orders.Place(ctx, pool, orders.Order{EventID: event, Buyer: "Buyer", Email: "b@example.com", Seats: 2}, orders.Jobs{Counter: true})
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 30*time.Second, "the counters on event 1", func() bool {
		return hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = 1`) == 10
	})
}

package host_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
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

package host_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/plugindb"
)

// With password authentication (a cluster of the test's own that requires
// scram-sha-256 on TCP): an administrator's `host setup --passfile`
// creates the owner and the plugins' login roles with passwords; hosts
// that log in as the owner, with the passfile, start two at once, serve
// the plugins as their own roles, and a restarted host serves again with
// no operator step.
//
// Not parallel: the passfile reaches the hosts through PGPASSFILE, as it
// does in production.
func TestPasswordAuthentication(t *testing.T) {
	cluster := hosttest.StartCluster(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, cluster.AdminURL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE stagedoor")
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))

	passfile := filepath.Join(t.TempDir(), "pgpass")
	// The administrator's password in the environment: a command line
	// holding one is refused.
	setup := exec.Command(hosttest.Build(t, "./cmd/host"), "setup",
		"--admin-url", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/stagedoor?sslmode=disable", cluster.Port),
		"--plugin", "counters", "--plugin", "tickets", "--passfile", passfile)
	setup.Env = append(os.Environ(), "PGPASSWORD="+cluster.AdminPassword)
	out, err := setup.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "plugin counters: login role usher_plugin_counters")
	st, err := os.Stat(passfile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	ownerURL := fmt.Sprintf("postgres://usher@127.0.0.1:%d/stagedoor?sslmode=disable", cluster.Port)
	// The server wants a password: without the passfile, no login.
	t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
	_, err = pgx.Connect(ctx, ownerURL)
	require.ErrorContains(t, err, "password authentication failed")
	t.Setenv("PGPASSFILE", passfile)
	// As the owner, with its password: Stagedoor's tables, then the
	// counters plugin's grants on them (its hosts load it by path: no
	// manifest to install from).
	out, err = exec.Command(hosttest.Build(t, "./cmd/host"), "migrate", "--stagedoor", "--database-url", ownerURL).CombinedOutput()
	require.NoError(t, err, "%s", out)
	owner, err := pgxpool.New(ctx, ownerURL)
	require.NoError(t, err)
	_, err = plugindb.Install(ctx, owner, hosttest.ShippedSpec(t, "counters"))
	owner.Close()
	require.NoError(t, err)

	rdb, stream := hosttest.Redis(t)
	counters := hosttest.Build(t, "./plugins/counters")
	cfg := func(name string) host.Config {
		return host.Config{DatabaseURL: ownerURL, Redis: rdb, Stream: stream, Plugins: []string{counters},
			Consumer: name, ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, Logger: hosttest.Logger(t, 100)}
	}
	// Two hosts start at once: both migrate, pin the kinds and grant the
	// functions; one of them wins each step, neither fails.
	var wg sync.WaitGroup
	hosts := make([]*hosttest.Running, 2)
	for i := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hosts[i] = hosttest.Start(t, cfg(fmt.Sprintf("scram-%d", i)))
		}()
	}
	wg.Wait()
	for _, h := range hosts {
		require.Equal(t, "usher_plugin_counters", pluginStatus(t, h, "counters").DBRole)
	}
	pool, err := pgxpool.New(ctx, ownerURL)
	require.NoError(t, err)
	defer pool.Close()
	b := &testBundle{pool: pool, rdb: rdb, stream: stream}
	want := b.placeOrders(t, 20, 2)
	b.waitDrained(t, 20)
	b.requireCounters(t, want)
	// Each plugin logged in as its own role, with its password.
	require.NotZero(t, hosttest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'usher_plugin_counters'`))

	// A restart needs nobody: the roles, passwords, pins and grants are
	// where the first start left them.
	for _, h := range hosts {
		require.NoError(t, h.Stop())
	}
	h := hosttest.Start(t, cfg("scram-restarted"))
	require.True(t, pluginStatus(t, h, "counters").Healthy)
	more := b.placeOrders(t, 10, 1)
	b.waitDrained(t, 30)
	b.requireCounters(t, more)
	require.Empty(t, h.Refusals())
}

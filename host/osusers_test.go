package host_test

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
)

// procUID is the real uid of process pid, from /proc/PID/status.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return ""
}

// siblingRun runs the hostile plugin's "siblings" attack on the counters
// plugin, both started as pluginUser, beside 20 counters jobs; it returns
// the bundle and the running host once every job has ended.
func siblingRun(t *testing.T, pluginUser string) (*hostileBundle, *hosttest.Running, []string) {
	t.Helper()
	b := hostileSetup(t)
	want := b.placeOrders(t, 20, 2)
	ids, probes := b.enqueue(t, []hostileCase{{"hostile_apply", "siblings", "", false}})
	cfg := b.config()
	cfg.PluginEnv = []string{"HOSTILE_SIBLING=counters"}
	cfg.Plugins = []string{hosttest.SharedBinary(t, hosttest.Build(t, "./plugins/counters"), "counters"),
		hosttest.SharedBinary(t, b.bin, "hostile")}
	cfg.PluginUser = pluginUser
	cfg.PluginUnhealthyRetry = 200 * time.Millisecond
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 60*time.Second, "the attack ended and the 20 counters jobs applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, probes) == 1 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, ids)+
				hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 1 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs WHERE kind = 'update_sales_counter'`) == 20
	})
	b.requireCounters(t, want)
	return b, h, ids
}

// Each plugin runs as an OS user of its own (PluginUser "...-{name}", the
// users `host setup-users` creates): a hostile plugin that finds its
// sibling's process cannot SIGKILL it, read its /proc/PID/environ or
// ptrace it (EPERM, EACCES), nor signal its host or read the host's
// environ; the sibling never restarts. With one user for both plugins (the
// --plugin-user nobody of before) the same attack kills the sibling: the
// attack is real.
func TestPluginsCannotKillOrReadEachOther(t *testing.T) {
	t.Parallel()
	t.Run("own users", func(t *testing.T) {
		t.Parallel()
		pattern := hosttest.PluginUsers(t, "counters", "hostile")
		b, h, ids := siblingRun(t, pattern)
		var reason string
		_ = b.pool.QueryRow(context.Background(), `SELECT reason FROM dead_letters LIMIT 1`).Scan(&reason)
		require.Empty(t, reason, "every attack on the sibling and the host was refused")
		require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, ids))
		counters, hostile := pluginStatus(t, h, "counters"), pluginStatus(t, h, "hostile")
		require.Zero(t, counters.Restarts, "the sibling was never killed")
		for name, st := range map[string]host.PluginStatus{"counters": counters, "hostile": hostile} {
			u, err := user.Lookup(pluginhost.UserFor(pattern, name))
			require.NoError(t, err)
			require.Equal(t, u.Uid, procUID(t, st.Pid), "%s runs as its own user", name)
		}
	})
	t.Run("one user for both", func(t *testing.T) {
		t.Parallel()
		b, h, _ := siblingRun(t, "nobody")
		var reason string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT reason FROM dead_letters LIMIT 1`).Scan(&reason))
		require.Contains(t, reason, "killed counters pid")
		require.Contains(t, reason, "read the environ of counters pid")
		hosttest.Eventually(t, 10*time.Second, "counters restarted after the kill", func() bool {
			return pluginStatus(t, h, "counters").Restarts >= 1
		})
	})
}

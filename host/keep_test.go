package host_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
)

// requireRuns checks that process pid runs the host's kept copy kept, and
// that the bytes it runs have SHA-256 sum.
func requireRuns(t *testing.T, pid int, kept, sum string) {
	t.Helper()
	exe := filepath.Join("/proc", strconv.Itoa(pid), "exe")
	path, err := os.Readlink(exe)
	require.NoError(t, err)
	require.Equal(t, kept, path, "the process runs the host's kept copy")
	got, err := pluginhost.FileSHA256(exe)
	require.NoError(t, err)
	require.Equal(t, sum, got, "the bytes the process runs")
}

// restarted waits for the plugin's process after pid to be up, restarts
// times restarted, and returns its status.
func restarted(t *testing.T, h *hosttest.Running, pid, restarts int) host.PluginStatus {
	t.Helper()
	var st host.PluginStatus
	hosttest.Eventually(t, 30*time.Second, "the supervisor to restart the plugin", func() bool {
		st = pluginStatus(t, h, "counters")
		return st.Restarts == restarts && st.Pid != pid && st.Healthy
	})
	return st
}

// A deploy renames a new build over the running plugin's binary, and the
// plugin crashes (kill -9) before the new manifest is written: the
// supervisor restarts the host's kept copy of the version it verified, the
// same version with the same SHA-256, and nothing is refused. The new
// manifest then swaps to the new build (its own kept copy), and a rollback
// goes back to the original bytes, though no file in the plugin directory
// holds them any more; a crash after the rollback restarts them again. The
// copy of the version rolled back from is removed.
func TestRestartAndRollbackRunKeptCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	m1 := d.install(b.counters, "counters", "counters", "1.0.0")
	h := hosttest.Start(t, b.dirConfig(d))
	ctx := context.Background()
	want := map[int64]int64{}
	orders := func(jobs int64) {
		t.Helper()
		for ev, s := range b.placeOrders(t, 10, 2) {
			want[ev] += s
		}
		b.waitDrained(t, jobs)
	}
	applied := func(version string) int64 {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = $1`, version)
	}
	orders(10)
	st := pluginStatus(t, h, "counters")
	require.Equal(t, filepath.Join(d.dir, "counters"), st.Path)
	require.Equal(t, m1.SHA256, st.SHA256)
	require.NotEqual(t, st.Path, st.Kept)
	requireRuns(t, st.Pid, st.Kept, m1.SHA256)

	// The deploy's rename, then the crash, before any new manifest.
	d.copy(hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0"), "counters")
	require.NoError(t, syscall.Kill(st.Pid, syscall.SIGKILL))
	re := restarted(t, h, st.Pid, 1)
	require.Equal(t, "1.0.0", re.Version)
	require.Equal(t, m1.SHA256, re.SHA256)
	require.Equal(t, st.Kept, re.Kept)
	requireRuns(t, re.Pid, st.Kept, m1.SHA256)
	orders(20)
	require.EqualValues(t, 20, applied("1.0.0"))

	// The new manifest: a swap to the build the directory holds now.
	m2, err := pluginhost.NewFileManifest(filepath.Join(d.dir, "counters"), "counters", "2.0.0", kindsOf(b.counters))
	require.NoError(t, err)
	require.NotEqual(t, m1.SHA256, m2.SHA256)
	hosttest.AddShipped(t, &m2, d.dir)
	d.writeManifest(m2)
	res, err := h.Reload(ctx, "counters")
	require.NoError(t, err)
	require.Equal(t, "swapped", res[0].Action, res[0].Error)
	sw := pluginStatus(t, h, "counters")
	require.Equal(t, "2.0.0", sw.Version)
	require.Equal(t, "1.0.0", sw.Previous)
	require.Equal(t, m2.SHA256, sw.SHA256)
	require.NotEqual(t, st.Kept, sw.Kept)
	requireRuns(t, sw.Pid, sw.Kept, m2.SHA256)
	orders(30)
	require.EqualValues(t, 10, applied("2.0.0"))

	// The rollback: 1.0.0's bytes, from the host's copy.
	rb, err := h.Rollback(ctx, "counters")
	require.NoError(t, err)
	require.Equal(t, "rolled back", rb.Action)
	back := pluginStatus(t, h, "counters")
	require.Equal(t, "1.0.0", back.Version)
	require.Equal(t, m1.SHA256, back.SHA256)
	require.Equal(t, st.Kept, back.Kept)
	requireRuns(t, back.Pid, st.Kept, m1.SHA256)
	kept, err := os.ReadDir(filepath.Dir(st.Kept))
	require.NoError(t, err)
	require.Len(t, kept, 1, "2.0.0's copy is removed: no version refers to it")
	require.Equal(t, filepath.Base(st.Kept), kept[0].Name())
	require.NoFileExists(t, sw.Kept)

	require.NoError(t, syscall.Kill(back.Pid, syscall.SIGKILL))
	re = restarted(t, h, back.Pid, 2)
	require.Equal(t, "1.0.0", re.Version)
	requireRuns(t, re.Pid, st.Kept, m1.SHA256)
	orders(40)
	require.EqualValues(t, 30, applied("1.0.0"))
	require.EqualValues(t, 10, applied("2.0.0"))
	b.requireCounters(t, want)
}

// A plugin from Config.Plugins has no manifest: the bytes the host read at
// load are its version. It runs from a kept copy checked against their
// SHA-256, so a build renamed over its path is not what a restart starts.
func TestPluginWithoutManifestRunsKeptCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.copy(b.counters, "counters")
	sum, err := pluginhost.FileSHA256(filepath.Join(d.dir, "counters"))
	require.NoError(t, err)
	cfg := b.config()
	cfg.Plugins = []string{filepath.Join(d.dir, "counters")}
	h := hosttest.Start(t, cfg)
	st := pluginStatus(t, h, "counters")
	require.Empty(t, st.Manifest)
	require.Equal(t, sum, st.SHA256)
	requireRuns(t, st.Pid, st.Kept, sum)

	d.copy(hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0"), "counters")
	require.NoError(t, syscall.Kill(st.Pid, syscall.SIGKILL))
	re := restarted(t, h, st.Pid, 1)
	require.Equal(t, "1.0.0", re.Version)
	requireRuns(t, re.Pid, st.Kept, sum)
	want := b.placeOrders(t, 10, 2)
	b.waitDrained(t, 10)
	b.requireCounters(t, want)
	require.EqualValues(t, 10, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '1.0.0'`))
}

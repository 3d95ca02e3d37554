package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
)

// install copies bin into dir as file, by rename, and writes its manifest
// with `host plugins manifest --write`.
func install(t *testing.T, dir, bin, file, name, version string) {
	t.Helper()
	b, err := os.ReadFile(bin)
	require.NoError(t, err)
	tmp := filepath.Join(dir, "."+file+".tmp")
	require.NoError(t, os.WriteFile(tmp, b, 0o755))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, file)))
	require.NoError(t, cmdPlugins(context.Background(),
		[]string{"manifest", filepath.Join(dir, file), "--name", name, "--version", version, "--write"}))
}

// The operator commands against a running host: list, reload of a new
// version (swapped), reload of a broken one (refused, non-zero exit).
func TestPluginsCommands(t *testing.T) {
	t.Parallel()
	_, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	dir := t.TempDir()
	install(t, dir, hosttest.Build(t, "./plugins/counters"), "counters", "counters", "1.0.0")
	m, err := pluginhost.ReadManifest(filepath.Join(dir, "counters.plugin.json"))
	require.NoError(t, err)
	require.Equal(t, pluginhost.FileManifest{Name: "counters", Version: "1.0.0", Binary: "counters", SHA256: m.SHA256}, m)

	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir,
		DisablePluginWatch: true, AdminAddr: "127.0.0.1:0"})
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	ctx := context.Background()
	addr := []string{"--admin-addr", h.AdminAddr()}

	require.NoError(t, cmdPlugins(ctx, addr))
	require.NoError(t, cmdPlugins(ctx, append([]string{"list"}, addr...)))

	install(t, dir, hosttest.Build(t, "./plugins/counters", "main.version=2.0.0"), "counters", "counters", "2.0.0")
	require.NoError(t, cmdPlugins(ctx, append([]string{"reload", "counters"}, addr...)))
	require.Equal(t, "2.0.0", h.Plugins()[0].Version)

	m, err = pluginhost.ReadManifest(filepath.Join(dir, "counters.plugin.json"))
	require.NoError(t, err)
	m.Version, m.SHA256 = "3.0.0", strings.Repeat("1", 64)
	_, err = m.Write(dir)
	require.NoError(t, err)
	err = cmdPlugins(ctx, append([]string{"reload"}, addr...))
	require.ErrorContains(t, err, "1 plugin(s) refused")
	require.Equal(t, "2.0.0", h.Plugins()[0].Version)

	err = cmdPlugins(ctx, append([]string{"reload", "nope"}, addr...))
	require.ErrorContains(t, err, `no valid manifest in `+dir+` names plugin "nope"`)
}

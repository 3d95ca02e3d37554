package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/doctest"
)

// The README's "Your plugin's schema and grants" lines, run as written by
// sh in a directory laid out as the repository is (bin/, and the tickets
// plugin's db/): the manifests carry the migrations' checksum and exactly
// the grants of the files the shipped plugins keep.
func TestREADMEPluginSchema(t *testing.T) {
	t.Parallel()
	root := hosttest.ModuleRoot(t)
	work := t.TempDir()
	plugins := filepath.Join(work, "bin", "plugins")
	require.NoError(t, os.MkdirAll(plugins, 0o755))
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/host"), filepath.Join(work, "bin", "host")))
	for _, name := range []string{"counters", "tickets"} {
		b, err := os.ReadFile(hosttest.Build(t, "./plugins/"+name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(plugins, name), b, 0o755))
	}
	require.NoError(t, os.CopyFS(filepath.Join(work, "plugins", "tickets", "db"), os.DirFS(filepath.Join(root, "plugins", "tickets", "db"))))

	lines := doctest.Block(t, "docs/plugins.md", "## Your plugin's schema and grants", "sh")
	require.Len(t, lines, 3)
	for _, line := range lines {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", line, out)
	}

	tickets, err := pluginhost.ReadManifest(filepath.Join(plugins, "tickets.plugin.json"))
	require.NoError(t, err)
	require.Equal(t, "tickets-migrations", tickets.Migrations)
	sum, err := pluginhost.MigrationsSHA256(os.DirFS(filepath.Join(root, "plugins", "tickets", "db", "migrations")))
	require.NoError(t, err)
	require.Equal(t, sum, tickets.MigrationsSHA256)
	want, err := pluginhost.ReadGrants(filepath.Join(root, "plugins", "tickets", "db", "grants.json"))
	require.NoError(t, err)
	require.Equal(t, want, tickets.Grants)

	counters, err := pluginhost.ReadManifest(filepath.Join(plugins, "counters.plugin.json"))
	require.NoError(t, err)
	require.Empty(t, counters.Migrations)
	want, err = pluginhost.ReadGrants(filepath.Join(root, "plugins", "counters", "db", "grants.json"))
	require.NoError(t, err)
	require.Equal(t, want, counters.Grants, "the --grant lines say what grants.json says")
}

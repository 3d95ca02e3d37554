package main_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/doctest"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// The tickets plugin stops at start without its two required settings,
// naming each that is missing, and writes nothing where it was started
// (no ./blobs in the host's directory); a host that starts it so refuses
// it with that reason and serves the rest. Reading its manifest (host
// plugins manifest) needs neither. docs/operating.md lists every setting
// beside run.
func TestTicketsNeedsItsSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := hosttest.Build(t, "./plugins/tickets")
	wd, blobs := t.TempDir(), filepath.Join(t.TempDir(), "blobs")
	start := func(env ...string) error {
		inst, err := pluginhost.Start(ctx, pluginhost.Config{Path: bin, Dir: wd, Env: env,
			Host: usherv1.UnimplementedHostServer{}, Logger: hosttest.Logger(t, slog.LevelError)})
		if err == nil {
			inst.Kill()
		}
		return err
	}
	err := start()
	require.ErrorContains(t, err, "USHER_BLOB_DIR is not set")
	require.ErrorContains(t, err, "MAILPROVIDER_URL is not set")
	require.ErrorContains(t, err, "pass it with host run --plugin-env USHER_BLOB_DIR=DIR")
	err = start("USHER_BLOB_DIR=" + blobs)
	require.ErrorContains(t, err, "MAILPROVIDER_URL is not set")
	require.NotContains(t, err.Error(), "USHER_BLOB_DIR is not set")
	require.NoDirExists(t, blobs, "a plugin that refused to start stored nothing")
	require.NoError(t, start("USHER_BLOB_DIR="+blobs, "MAILPROVIDER_URL=http://127.0.0.1:8025"))
	require.DirExists(t, blobs)
	left, err := os.ReadDir(wd)
	require.NoError(t, err)
	require.Empty(t, left, "nothing written in the directory it was started in")

	m, err := pluginhost.Probe(ctx, bin)
	require.NoError(t, err, "the manifest is read without the settings")
	require.Equal(t, "tickets", m.Name)
	require.Len(t, m.Kinds, 2)

	b := setup(t)
	cfg := b.config(0)
	cfg.Plugins = []string{b.plugin, hosttest.Build(t, "./plugins/counters")}
	cfg.PluginEnv = nil
	h := hosttest.Start(t, cfg)
	require.Len(t, h.Refusals(), 1)
	require.Contains(t, h.Refusals()[0].Error, "USHER_BLOB_DIR is not set")
	require.True(t, slices.Contains(h.Kinds(), "update_sales_counter"), "the others serve")
	require.False(t, slices.Contains(h.Kinds(), "render_tickets"))
	require.NoError(t, h.Stop())

	settings := doctest.After(t, "docs/operating.md", "**A plugin's settings.**")
	for _, name := range []string{"USHER_BLOB_DIR", "MAILPROVIDER_URL", "TICKETS_CLAIM_LEASE"} {
		require.Contains(t, settings, "| `"+name+"` |", "docs/operating.md's settings table")
	}
}

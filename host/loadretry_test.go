package host_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
)

// A plugin whose load failed for a reason that was not its own (here its
// role could open no connection, as while Postgres restarts) is loaded
// again once the database lets it, with no reload from an operator: a
// host started during a database restart serves its plugins after it
// (the chaos suite's host-2, which served nothing for the rest of its
// run, found this).
func TestPluginLoadRetriedAfterTransientRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, hosttest.DatabaseURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	role := pgx.Identifier{sandbox.PluginRole("lateload")}.Sanitize()
	_, err = admin.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT 0")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "ALTER ROLE "+role+" CONNECTION LIMIT -1") })

	bin := hosttest.Build(t, "./host/testdata/rawplugin", "main.name=lateload")
	for _, c := range []struct {
		name   string
		config func() host.Config
	}{
		{"manifest", func() host.Config {
			d := newPluginDir(t)
			d.install(bin, "lateload", "lateload", "0.0.1")
			return b.dirConfig(d)
		}},
		{"binary", func() host.Config {
			cfg := b.config()
			cfg.Plugins = []string{bin}
			return cfg
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err = admin.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT 0")
			require.NoError(t, err)
			cfg := c.config()
			cfg.PluginRetryInterval = 100 * time.Millisecond
			h := hosttest.Start(t, cfg)
			require.Len(t, h.Refusals(), 1)
			require.Contains(t, h.Refusals()[0].Error, "too many connections")
			require.False(t, slices.Contains(h.Kinds(), "raw_job"))
			time.Sleep(500 * time.Millisecond) // retries, refused again
			require.False(t, slices.Contains(h.Kinds(), "raw_job"))

			_, err = admin.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT -1")
			require.NoError(t, err)
			hosttest.Eventually(t, 10*time.Second, "the plugin loaded on a retry", func() bool {
				return slices.Contains(h.Kinds(), "raw_job")
			})
			require.Empty(t, h.Refusals())
			require.Equal(t, "0.0.1", pluginStatus(t, h, "lateload").Version)
			require.NoError(t, h.Stop())
		})
	}
}

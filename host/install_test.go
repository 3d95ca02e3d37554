package host_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
)

// A plugin whose install is refused (its migrations changed after its
// manifest was written; a migration that leaves its role) is not served,
// with the reason; the host serves the others.
func TestRefusedInstallIsNotServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tickets := hosttest.Build(t, "./plugins/tickets")
	for _, c := range []struct {
		name, want string
		tamper     func(t *testing.T, m *pluginhost.FileManifest, dir string)
	}{
		{"changed migration", "not the manifest's migrations_sha256", func(t *testing.T, m *pluginhost.FileManifest, dir string) {
			f, err := os.OpenFile(filepath.Join(dir, m.Migrations, "00001_email_sends.sql"), os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString("\n-- +goose Up\nCREATE TABLE sneaky (id int);\n")
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"hostile migration", "RESET ROLE", func(t *testing.T, m *pluginhost.FileManifest, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, m.Migrations, "00002_escape.sql"),
				[]byte("-- +goose Up\nRESET ROLE;\nDELETE FROM outbox;\n"), 0o644))
			sum, err := pluginhost.MigrationsSHA256(os.DirFS(filepath.Join(dir, m.Migrations)))
			require.NoError(t, err)
			m.MigrationsSHA256 = sum // a manifest written for it: the words refuse it
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newPluginDir(t)
			d.install(b.counters, "counters", "counters", "1.0.0")
			d.copy(tickets, "tickets")
			m, err := pluginhost.NewFileManifest(filepath.Join(d.dir, "tickets"), "tickets", "1.0.0", []string{"render_tickets", "send_tickets"})
			require.NoError(t, err)
			hosttest.AddShipped(t, &m, d.dir)
			c.tamper(t, &m, d.dir)
			d.writeManifest(m)

			cfg := b.dirConfig(d)
			// Its settings, so that what refuses it is its install, not a
			// start without them (the plugin stops at start then).
			cfg.PluginEnv = append(cfg.PluginEnv, "USHER_BLOB_DIR="+t.TempDir(), "MAILPROVIDER_URL=http://127.0.0.1:1")
			h := hosttest.Start(t, cfg)
			require.Len(t, h.Refusals(), 1)
			require.Contains(t, h.Refusals()[0].Error, c.want)
			require.Contains(t, h.Refusals()[0].Error, "tickets")
			require.True(t, slices.Contains(h.Kinds(), "update_sales_counter"))
			require.False(t, slices.Contains(h.Kinds(), "send_tickets"))
			require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'sneaky'`))
			require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_tickets.goose_db_version WHERE version_id = 2`))
			require.NoError(t, h.Stop())
		})
	}
}

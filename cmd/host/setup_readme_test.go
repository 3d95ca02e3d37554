package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/doctest"
)

// The README's set-up commands, as written: only the README's server
// address and database give way to the test's own database, its blob
// directory to one of the test's, and bin/ is a directory of the test's.
func TestReadmeSetup(t *testing.T) {
	t.Parallel()
	lines := doctest.Block(t, "docs/security.md", "**Set up once, as an administrator:**", "sh")
	require.Len(t, lines, 4)
	setup, migrate, install, run := lines[0], lines[1], lines[2], lines[3]
	require.True(t, strings.HasPrefix(setup, "bin/host setup "), setup)
	require.True(t, strings.HasPrefix(migrate, "PGPASSFILE=pgpass bin/host migrate "), migrate)
	require.True(t, strings.HasPrefix(install, "PGPASSFILE=pgpass bin/host plugins install "), install)
	require.True(t, strings.HasPrefix(run, "PGPASSFILE=pgpass bin/host run "), run)
	// docs/operating.md's run with the tickets plugin's settings is this
	// run, its database read from DATABASE_URL: what runs below is it.
	require.Equal(t, []string{strings.Replace(strings.TrimPrefix(run, "PGPASSFILE=pgpass "), " --database-url postgres://usher@127.0.0.1:5432/stagedoor", "", 1)},
		doctest.Block(t, "docs/operating.md", "**A plugin's settings.**", "text"))

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, hosttest.DatabaseURL())
	require.NoError(t, err)
	// No CREATE DATABASE: the README's setup creates it.
	db := "usher_t_" + hosttest.Suffix()
	// The README's setup has one deployment on its cluster; the test's
	// cluster is shared (by other tests, other checkouts), so the test's
	// deployment has a name of its own, and its roles are dropped after.
	dep := "t" + hosttest.Suffix()
	ownerRole := sandbox.OwnerIn(dep)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		for _, p := range []string{"counters", "tickets"} {
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+sandbox.PluginRoleIn(dep, p)+", "+sandbox.SchemaRoleIn(dep, p))
		}
		_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+ownerRole)
		_ = admin.Close(ctx)
	})

	dir := t.TempDir()
	plugins := filepath.Join(dir, "bin", "plugins")
	require.NoError(t, os.MkdirAll(plugins, 0o755))
	host := hosttest.Build(t, "./cmd/host")
	for name, kinds := range map[string][]string{"counters": {"update_sales_counter"}, "tickets": {"render_tickets", "send_tickets"}} {
		bin := filepath.Join(plugins, name)
		b, err := os.ReadFile(hosttest.Build(t, "./plugins/"+name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(bin, b, 0o755))
		// As make plugins writes them.
		args := []string{"plugins", "manifest", bin, "--name", name, "--version", "1.0.0", "--write",
			"--grants", filepath.Join(hosttest.ModuleRoot(t), "plugins", name, "db", "grants.json")}
		if name == "tickets" {
			require.NoError(t, os.CopyFS(filepath.Join(plugins, "tickets-migrations"),
				os.DirFS(filepath.Join(hosttest.ModuleRoot(t), "plugins", "tickets", "db", "migrations"))))
			args = append(args, "--migrations", filepath.Join(plugins, "tickets-migrations"))
		}
		for _, k := range kinds {
			args = append(args, "--kind", k)
		}
		out, err := exec.Command(host, args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	require.NoError(t, os.Symlink(host, filepath.Join(dir, "bin", "host")))
	ours := strings.Replace(hosttest.DatabaseURL(), "/test?", "/"+db+"?", 1)
	ours = strings.TrimSuffix(strings.TrimPrefix(ours, "postgres://postgres@"), "?sslmode=disable")
	local := func(line string) []string {
		line = strings.ReplaceAll(line, "127.0.0.1:5432/stagedoor", ours)
		line = strings.ReplaceAll(line, "USHER_BLOB_DIR=/var/lib/usher/blobs", "USHER_BLOB_DIR="+filepath.Join(dir, "blobs"))
		return strings.Fields(strings.ReplaceAll(line, "//usher@", "//"+ownerRole+"@"))
	}

	cmd := exec.Command(filepath.Join(dir, "bin", "host"), append(local(setup)[1:], "--deployment", dep)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "created database "+db+"\n", "the database did not exist")
	st, err := os.Stat(filepath.Join(dir, "pgpass"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	// The runtime's owner, with the password setup gave it: Stagedoor's
	// tables, then the plugins' schemas and grants.
	owner := func(line string) string {
		f := local(line)
		cmd := exec.Command(filepath.Join(dir, "bin", "host"), f[2:]...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), f[0])
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s\n%s", line, out)
		return string(out)
	}
	require.Contains(t, owner(migrate), "stagedoor migrations applied")
	out = []byte(owner(install))
	require.Contains(t, string(out), "tickets 1.0.0: installed (1 migration(s) applied 00001_email_sends.sql)")
	require.Contains(t, string(out), "UPDATE (pdf_key) ON tickets\n")
	require.Contains(t, string(out), "counters 1.0.0: installed (0 migration(s) applied)")
	require.Contains(t, owner(install), "tickets 1.0.0: unchanged")

	f := local(run)
	env, f := f[0], f[1:]
	_, stream := hosttest.Redis(t)
	cmd = exec.Command(filepath.Join(dir, "bin", "host"), f[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env, "USHER_STREAM="+stream, "USHER_ADMIN_ADDR=127.0.0.1:0", "REDIS_URL="+hosttest.RedisURL(),
		"XDG_STATE_HOME="+filepath.Join(dir, "state"))
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	loaded := map[string]bool{}
	sc := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer deadline.Stop()
	// This cluster trusts every login from this machine, so the host
	// warns, for each plugin, that it could log in by itself.
	warned := map[string]bool{}
	for sc.Scan() && (len(loaded) < 2 || len(warned) < 2) {
		line := sc.Text()
		require.NotContains(t, line, "plugin refused", line)
		for _, p := range []string{"counters", "tickets"} {
			if strings.Contains(line, `"msg":"plugin loaded","plugin":"`+p+`"`) {
				require.Contains(t, line, `"db_role":"`+sandbox.PluginRoleIn(dep, p)+`"`)
				loaded[p] = true
			}
			if strings.Contains(line, "without a password (trust authentication)") && strings.Contains(line, `"plugin":"`+p+`"`) {
				warned[p] = true
			}
		}
	}
	require.Len(t, loaded, 2, "both plugins loaded as their own roles")
	require.Len(t, warned, 2, "a warning for each plugin role trust lets in")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	var tail []string
	for sc.Scan() {
		tail = append(tail, sc.Text())
	}
	require.NoError(t, cmd.Wait(), "%s", strings.Join(tail, "\n"))
}

package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
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
	cl := &cli{stdout: io.Discard, stderr: io.Discard, now: time.Now}
	require.NoError(t, cl.run(context.Background(),
		[]string{"plugins", "manifest", filepath.Join(dir, file), "--name", name, "--version", version, "--kind", "update_sales_counter", "--write",
			"--grants", filepath.Join(hosttest.ModuleRoot(t), "plugins", "counters", "db", "grants.json")}))
}

// operator runs the host binary as an operator whose home is home: no
// USHER_* or XDG_* variable of the test's environment leaks in, only env.
type operator struct {
	t    *testing.T
	bin  string
	home string
	env  []string
}

func (o operator) cmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + o.home}, o.env...)
	return cmd
}

// ok runs the binary and returns its output, failing the test on a
// non-zero exit.
func (o operator) ok(args ...string) string {
	o.t.Helper()
	out, err := o.cmd(o.bin, args...).CombinedOutput()
	require.NoError(o.t, err, "host %v: %s", args, out)
	return string(out)
}

// fails runs the binary and returns its output, failing the test on a
// zero exit.
func (o operator) fails(args ...string) string {
	o.t.Helper()
	out, err := o.cmd(o.bin, args...).CombinedOutput()
	require.Error(o.t, err, "host %v: %s", args, out)
	return string(out)
}

func (o operator) with(env ...string) operator {
	o.env = append(append([]string(nil), o.env...), env...)
	return o
}

// runningHost starts a host serving the counters plugin from a manifest
// directory, with its admin token in home's default token file, and
// returns it, the plugin directory and the operator's view of it.
func runningHost(t *testing.T, home string) (*hosttest.Running, string, operator) {
	t.Helper()
	_, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	dir := t.TempDir()
	install(t, dir, hosttest.Build(t, "./plugins/counters"), "counters", "counters", "1.0.0")
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir,
		DisablePluginWatch: true, AdminAddr: "127.0.0.1:0",
		AdminTokenFile: filepath.Join(home, ".local", "state", "usher", "admin-token")})
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	o := operator{t: t, bin: hosttest.Build(t, "./cmd/host"), home: home, env: []string{"USHER_ADMIN_ADDR=" + h.AdminAddr()}}
	return h, dir, o
}

// The operator commands against a running host, with the token from the
// default file: list, reload of a new version (swapped), reload of a
// broken one (refused, non-zero exit).
func TestPluginsCommands(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	h, dir, o := runningHost(t, home)
	m, err := pluginhost.ReadManifest(filepath.Join(dir, "counters.plugin.json"))
	require.NoError(t, err)
	require.Equal(t, pluginhost.FileManifest{Name: "counters", Version: "1.0.0", Binary: "counters", SHA256: m.SHA256, Kinds: []string{"update_sales_counter"}, Grants: m.Grants}, m)
	require.Len(t, m.Grants, 2, "the counters plugin's grants, from plugins/counters/db/grants.json")

	require.Contains(t, o.ok("plugins"), "counters  1.0.0")
	require.Contains(t, o.ok("plugins", "list"), "counters  1.0.0")
	require.Contains(t, o.ok("plugins", "list", "--admin-addr", h.AdminAddr()), "counters  1.0.0")
	require.Contains(t, o.ok("plugins", "--json"), `"name": "counters"`)
	require.Contains(t, o.ok("--json", "plugins", "list", "--admin-addr", h.AdminAddr()), `"version": "1.0.0"`)

	install(t, dir, hosttest.Build(t, "./plugins/counters", "main.version=2.0.0"), "counters", "counters", "2.0.0")
	out := o.ok("plugins", "reload", "counters")
	require.Contains(t, out, "counters: swapped 1.0.0 -> 2.0.0")
	require.Contains(t, out, "old version's calls finished in ")
	require.NotContains(t, out, " in 0s", "a drain too short for milliseconds still says how long")
	require.Equal(t, "2.0.0", h.Plugins()[0].Version)

	m, err = pluginhost.ReadManifest(filepath.Join(dir, "counters.plugin.json"))
	require.NoError(t, err)
	m.Version, m.SHA256 = "3.0.0", strings.Repeat("1", 64)
	_, err = m.Write(dir)
	require.NoError(t, err)
	require.Contains(t, o.fails("plugins", "reload"), "1 plugin(s) refused")
	require.Equal(t, "2.0.0", h.Plugins()[0].Version)

	require.Contains(t, o.fails("plugins", "reload", "nope"), `no valid manifest in `+dir+` names plugin "nope"`)
}

// Without the host's token the commands fail, saying what to set; flags
// are taken only where they belong.
func TestPluginsCommandsToken(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	h, _, o := runningHost(t, home)
	tokenFile := filepath.Join(home, ".local", "state", "usher", "admin-token")
	const refused = "the admin API refused the token (from %s): set USHER_ADMIN_TOKEN or --admin-token-file to the host's token file"

	// The token by variable, by flag, and by XDG_STATE_HOME.
	require.Contains(t, o.with("USHER_ADMIN_TOKEN="+h.AdminToken).ok("plugins", "list"), "counters")
	require.Contains(t, o.ok("plugins", "list", "--admin-token-file", tokenFile), "counters")
	require.Contains(t, o.with("XDG_STATE_HOME="+filepath.Join(home, ".local", "state")).ok("plugins", "list"), "counters")
	require.Contains(t, o.with("USHER_ADMIN_TOKEN_FILE="+tokenFile).ok("plugins", "list"), "counters")
	require.Contains(t, o.with("USHER_ADMIN_TOKEN="+h.AdminToken, "USHER_ADMIN_TOKEN_FILE="+tokenFile).fails("plugins", "list"),
		"both USHER_ADMIN_TOKEN and USHER_ADMIN_TOKEN_FILE are set: use one")

	// No token anywhere.
	nobody := o
	nobody.home = t.TempDir()
	out := nobody.fails("plugins", "list")
	require.Contains(t, out, "no admin token: USHER_ADMIN_TOKEN is not set and "+
		filepath.Join(nobody.home, ".local", "state", "usher", "admin-token")+" does not exist")
	// The wrong token, by variable and by file.
	out = o.with("USHER_ADMIN_TOKEN="+strings.Repeat("f", 64)).fails("plugins", "reload")
	require.Contains(t, out, strings.ReplaceAll(refused, "%s", "USHER_ADMIN_TOKEN"))
	wrong := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(wrong, []byte(strings.Repeat("f", 64)), 0o600))
	out = o.fails("plugins", "list", "--admin-token-file", wrong)
	require.Contains(t, out, strings.ReplaceAll(refused, "%s", wrong))
	// A file others may read.
	require.NoError(t, os.Chmod(wrong, 0o644))
	require.Contains(t, o.fails("plugins", "list", "--admin-token-file", wrong), "has mode 0644: group or others may read it")

	// Flags: both token sources, a flag before the subcommand (taken), an empty
	// address or file, an unknown flag, a second name.
	require.Contains(t, o.with("USHER_ADMIN_TOKEN="+h.AdminToken).fails("plugins", "list", "--admin-token-file", tokenFile),
		"both USHER_ADMIN_TOKEN and --admin-token-file are given: use one")
	require.Contains(t, o.ok("plugins", "--admin-addr", h.AdminAddr(), "reload"), "counters: unchanged (1.0.0)")
	require.Contains(t, o.fails("plugins", "list", "--admin-addr", ""), "--admin-addr is empty")
	require.Contains(t, o.fails("plugins", "list", "--admin-token-file", ""), "--admin-token-file needs a path")
	require.Contains(t, o.fails("plugins", "list", "--admin-token", h.AdminToken), "unknown flag --admin-token")
	require.Contains(t, o.fails("plugins", "reload", "counters", "tickets"), `reload takes at most one plugin name, got ["counters" "tickets"]`)
	require.Contains(t, o.fails("plugins", "reload", "--timeout", "0s"), "--timeout must be positive")
	require.Contains(t, o.fails("plugins", "reload", "--", "--admin-addr"), `names plugin "--admin-addr"`)
	require.Equal(t, "1.0.0", h.Plugins()[0].Version, "nothing was reloaded")

	// host run checks its token flags before it connects anywhere.
	require.Contains(t, o.with("USHER_ADMIN_TOKEN="+h.AdminToken).fails("run", "--admin-token-file", tokenFile),
		"both USHER_ADMIN_TOKEN and --admin-token-file are given: use one")
	require.Contains(t, o.fails("run", "--plugin-dir", "x", "extra", "--admin-addr", ""), `run takes no arguments, got ["extra"]`)
}

// plugins rollback: nothing to roll back to before a swap; after one, back
// to the version before (its binary was renamed over by the deploy, so the
// host starts the copy it kept), shown in plugins list; the rolled-back
// version is refused until a reload asks for it.
func TestPluginsRollbackCommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	h, dir, o := runningHost(t, home)
	require.Contains(t, o.fails("plugins", "rollback", "counters"), "plugin counters has no previous version to roll back to")
	require.Contains(t, o.fails("plugins", "rollback"), "rollback takes one plugin name")
	require.Contains(t, o.fails("plugins", "rollback", "nope"), `no plugin "nope" is loaded`)

	install(t, dir, hosttest.Build(t, "./plugins/counters", "main.version=2.0.0"), "counters", "counters", "2.0.0")
	require.Contains(t, o.ok("plugins", "reload", "counters"), "counters: swapped 1.0.0 -> 2.0.0")
	require.Contains(t, o.ok("plugins", "list"), "counters: 2.0.0 on probation until ")

	out := o.ok("plugins", "rollback", "counters", "--by", "ada")
	require.Contains(t, out, "counters: rolled back 2.0.0 -> 1.0.0 (previous version up in ")
	require.Equal(t, "1.0.0", h.Plugins()[0].Version)
	require.EqualValues(t, 1, hosttest.Count(t, h.Pool(), `SELECT count(*) FROM operator_actions WHERE action = 'rollback_plugin'
		AND target = 'counters' AND actor LIKE 'ada via the admin API from %' AND detail = '2.0.0 → 1.0.0'`), "recorded, who and what")
	out = o.ok("plugins", "list")
	require.Contains(t, out, "counters  1.0.0")
	require.Contains(t, out, "counters: rolled back 2.0.0 -> 1.0.0 at ")
	require.Contains(t, out, "(requested): asked for (plugins rollback)")
	require.Contains(t, out, "counters: 2.0.0 refused: rolled back from 2.0.0 to 1.0.0")
	require.Contains(t, o.fails("plugins", "rollback", "counters"), "no previous version to roll back to")

	// An operator's reload asks for the refused manifest again.
	require.Contains(t, o.ok("plugins", "reload", "counters"), "counters: swapped 1.0.0 -> 2.0.0")

	// The swap history, newest first, from the database the host wrote
	// it to: the swap, the rollback asked for, the swap again.
	var list []host.PluginStatus
	require.NoError(t, json.Unmarshal([]byte(o.ok("plugins", "list", "--json")), &list))
	require.Len(t, list, 1)
	var history []string
	for _, s := range list[0].Swaps {
		require.Equal(t, "counters", s.Plugin)
		require.NotEmpty(t, s.Host)
		history = append(history, strings.Join([]string{s.Action, s.From, s.To, s.Cause}, " "))
	}
	require.Equal(t, []string{"swapped 1.0.0 2.0.0 reload", "rolled back 2.0.0 1.0.0 requested", "swapped 1.0.0 2.0.0 reload"}, history)
	require.EqualValues(t, 0, list[0].InFlight, "nothing runs")
	require.Contains(t, o.ok("plugins", "list"), "swap history (the last 10 per plugin, every host, newest first)")
}

// A manifest says what its binary says: plugins manifest starts the binary
// and refuses a name, version or kinds it does not report.
func TestManifestChecksTheBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := countersCopy(t, dir)
	run := func(args ...string) error {
		cl := &cli{stdout: io.Discard, stderr: io.Discard, now: time.Now}
		return cl.run(context.Background(), append([]string{"plugins", "manifest", bin}, args...))
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--name", "tickets", "--version", "1.0.0", "--kind", "update_sales_counter"}, `reports plugin "counters" version "1.0.0", not "tickets"`},
		{[]string{"--name", "counters", "--version", "2.0.0", "--kind", "update_sales_counter"}, `not "counters" version "2.0.0"`},
		{[]string{"--name", "counters", "--version", "1.0.0", "--kind", "send_tickets"}, "serves kinds [update_sales_counter], not [send_tickets]"},
		{[]string{"--name", "counters", "--version", "1.0.0", "--kind", "update_sales_counter", "--kind", "other"}, "serves kinds"},
	} {
		err := run(c.args...)
		require.ErrorContains(t, err, c.want, "%q", c.args)
	}
	require.NoError(t, run("--name", "counters", "--version", "1.0.0", "--kind", "update_sales_counter", "--write"))
	_, err := os.Stat(filepath.Join(dir, "counters.plugin.json"))
	require.NoError(t, err)
}

// countersCopy copies the counters plugin's binary into dir as
// dir/counters, a file of the test's own that a manifest can name.
func countersCopy(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "counters")
	b, err := os.ReadFile(hosttest.Build(t, "./plugins/counters"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	return bin
}

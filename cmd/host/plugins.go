package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
)

func (cl *cli) pluginCommands() []*command {
	return []*command{
		{name: "list", summary: "the plugins a running host serves: version, protocol, pid, health, role, checksum", help: tokenHelp, flags: cl.pluginsList},
		{name: "reload", args: "[NAME]", summary: "ask a running host to re-read its plugin directory's manifests and load or hot-swap what changed",
			help: "Only NAME when given. Exits non-zero when a load or swap was refused.\n\n" + tokenHelp, flags: cl.pluginsReload},
		{name: "rollback", args: "NAME", summary: "ask a running host to swap NAME back to the version its last swap replaced",
			help: "The manifest rolled back from is refused until it changes (or a reload asks for it).\n\n" + tokenHelp, flags: cl.pluginsRollback},
		{name: "manifest", args: "BINARY", summary: "print BINARY's manifest (name, version, binary, SHA-256, migrations, grants), or write it beside the binary as NAME.plugin.json",
			help: manifestHelp, flags: cl.pluginsManifest},
		{name: "install", args: "[NAME...]", summary: "install the plugins of --plugin-dir (or only NAME...) in the database: verify, apply their migrations, grant what their manifests declare",
			help: installHelp, flags: cl.pluginsInstall},
		{name: "init", args: "NAME", summary: "write a new plugin module to start from: a handler per guard, their sdktest tests, migrations, grants, a Makefile",
			help: "NAME is the plugin's name (lower-case letters, digits and _, starting with a letter): its database role is usher_plugin_NAME.\n" +
				"The directory (--dir, default ./NAME) must be new or empty.",
			flags: cl.pluginsInit},
	}
}

const tokenHelp = `The command sends the host's admin token: USHER_ADMIN_TOKEN, else the
file --admin-token-file names (default $XDG_STATE_HOME/usher/admin-token,
else ~/.local/state/usher/admin-token, the file a host creates by default).`

// adminClient talks to a running host's admin API with its token.
type adminClient struct {
	addr      string
	tokenFrom tokenFlags
	token     string
	source    string // where the token came from, for messages
}

func (c *adminClient) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "admin-addr", env("USHER_ADMIN_ADDR", "127.0.0.1:9464"), "the running host's admin address (USHER_ADMIN_ADDR)")
	c.tokenFrom.register(fs)
}

// load validates the flags and reads the token; call it after parsing.
func (c *adminClient) load() error {
	if c.addr == "" {
		return errors.New("--admin-addr is empty: give the running host's admin address")
	}
	tok, file, err := c.tokenFrom.resolve()
	if err != nil {
		return err
	}
	if tok != "" {
		c.token, c.source = tok, "USHER_ADMIN_TOKEN"
		return nil
	}
	c.token, err = admin.ReadTokenFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no admin token: USHER_ADMIN_TOKEN is not set and %s does not exist; "+
			"set USHER_ADMIN_TOKEN or --admin-token-file to the host's token file", file)
	}
	c.source = file
	return err
}

// do sends the request with the token. A refusal by the admin API (401,
// 403) is an error that says what to fix; other answers are the caller's.
func (c *adminClient) do(ctx context.Context, method, path string) (*http.Response, error) {
	return c.send(ctx, method, path, nil)
}

// send is do with a JSON body (nil for none).
func (c *adminClient) send(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no host answers on %s: %w", c.addr, err)
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		resp.Body.Close()
		return nil, fmt.Errorf("the admin API refused the token (from %s): set USHER_ADMIN_TOKEN or --admin-token-file to the host's token file", c.source)
	case http.StatusForbidden:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("%s refused the request: %s", c.addr, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

func (cl *cli) pluginsList(fs *flag.FlagSet) runner {
	var c adminClient
	c.register(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("plugins list takes no arguments, got %q", pos)}
		}
		if err := c.load(); err != nil {
			return err
		}
		resp, err := c.do(ctx, http.MethodGet, "/plugins")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return fmt.Errorf("host answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
		}
		var list []host.PluginStatus
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(cl.stdout, list)
		}
		return printPlugins(cl.stdout, list)
	}
}

// printPlugins prints list as `host plugins list` shows it: a line per
// plugin, its probation, last rollback and refusal, then the swap history
// of every plugin, newest first.
func printPlugins(out io.Writer, list []host.PluginStatus) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tVERSION\tPROTOCOL\tPID\tHEALTHY\tRESTARTS\tIN FLIGHT\tPARKED NOW/TOTAL\tDB ROLE\tVERIFIED\tKINDS")
	for _, p := range list {
		role, verified := p.DBRole, "no manifest"
		if role == "" {
			role = "(host's)"
		}
		if p.SHA256 != "" {
			verified = "sha256 " + p.SHA256[:min(12, len(p.SHA256))] + "…"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%v\t%d\t%d\t%d/%d\t%s\t%s\t%v\n", p.Name, p.Version, p.Protocol, p.Pid, p.Healthy, p.Restarts,
			p.InFlight, p.ParkedNow, p.Parked, role, verified, p.Kinds)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, p := range list {
		if p.ProbationUntil != nil {
			fmt.Fprintf(out, "%s: %s on probation until %s (rolled back to %s if it fails)\n", p.Name, p.Version,
				p.ProbationUntil.Format(time.RFC3339), p.Previous)
		}
		if r := p.LastRollback; r != nil {
			fmt.Fprintf(out, "%s: rolled back %s -> %s at %s (%s): %s\n", p.Name, r.From, r.To, r.At.Format(time.RFC3339), r.Cause, r.Reason)
		}
		if p.Refused != "" {
			fmt.Fprintf(out, "%s: %s refused: %s\n", p.Name, p.Refused, p.RefusedReason)
		}
	}
	fmt.Fprintf(out, "\nswap history (the last %d per plugin, every host, newest first)\n", host.SwapHistory)
	swapped := false
	for _, p := range list {
		swapped = swapped || len(p.Swaps) > 0
	}
	if !swapped {
		_, err := fmt.Fprintln(out, "  none")
		return err
	}
	fmt.Fprintln(w, "  PLUGIN\tAT\tHOST\tACTION\tFROM\tTO\tCAUSE\tREASON")
	for _, p := range list {
		for _, s := range p.Swaps {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, s.At.UTC().Format(time.RFC3339), s.Host, s.Action, orDash(s.From),
				orDash(s.To), s.Cause, orDash(truncate(s.Reason, 100)))
		}
	}
	return w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (cl *cli) pluginsReload(fs *flag.FlagSet) runner {
	var c adminClient
	c.register(fs)
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the host's answer (a swap drains in-flight jobs first)")
	return func(ctx context.Context, pos []string) error {
		return cl.reload(ctx, &c, *timeout, pos)
	}
}

func (cl *cli) reload(ctx context.Context, c *adminClient, timeout time.Duration, pos []string) error {
	if len(pos) > 1 {
		return usageError{fmt.Sprintf("reload takes at most one plugin name, got %q", pos)}
	}
	if timeout <= 0 {
		return usageError{fmt.Sprintf("--timeout must be positive, got %s", timeout)}
	}
	if err := c.load(); err != nil {
		return err
	}
	path := "/plugins/reload"
	if len(pos) == 1 {
		path += "?name=" + url.QueryEscape(pos[0])
	}
	out, err := c.swap(ctx, timeout, path)
	if err != nil {
		return err
	}
	refused := 0
	for _, r := range out.Results {
		switch r.Action {
		case "swapped":
			fmt.Fprintf(cl.stdout, "%s: swapped %s -> %s (new version up in %s, %s)\n", r.Plugin, r.From, r.To,
				roundDuration(r.StartTime), drainText(r))
		case "loaded":
			fmt.Fprintf(cl.stdout, "%s: loaded %s\n", r.Plugin, r.To)
		case "unchanged":
			fmt.Fprintf(cl.stdout, "%s: unchanged (%s)\n", r.Plugin, r.From)
		default:
			refused++
			from := r.From
			if from == "" {
				from = "not loaded"
			}
			fmt.Fprintf(cl.stdout, "%s: %s refused, %s keeps serving: %s\n", r.Plugin, r.To, from, r.Error)
		}
	}
	if refused > 0 {
		return fmt.Errorf("%d plugin(s) refused", refused)
	}
	return nil
}

func (cl *cli) pluginsRollback(fs *flag.FlagSet) runner {
	var c adminClient
	c.register(fs)
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the host's answer (a rollback drains in-flight jobs first)")
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("rollback takes one plugin name, got %q", pos)}
		}
		if *timeout <= 0 {
			return usageError{fmt.Sprintf("--timeout must be positive, got %s", *timeout)}
		}
		if err := c.load(); err != nil {
			return err
		}
		out, err := c.swap(ctx, *timeout, "/plugins/rollback?name="+url.QueryEscape(pos[0])+"&by="+url.QueryEscape(*by))
		if err != nil {
			return err
		}
		for _, r := range out.Results {
			fmt.Fprintf(cl.stdout, "%s: rolled back %s -> %s (previous version up in %s, %s)\n", r.Plugin, r.From, r.To,
				roundDuration(r.StartTime), drainText(r))
		}
		return nil
	}
}

// swap posts a reload or rollback to the admin API and returns the host's
// answer, or the error it answered.
func (c *adminClient) swap(ctx context.Context, timeout time.Duration, path string) (host.ReloadResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out host.ReloadResponse
	resp, err := c.do(ctx, http.MethodPost, path)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("host answered %s: %w", resp.Status, err)
	}
	if out.Error != "" {
		return out, errors.New(out.Error)
	}
	return out, nil
}

// drainText says how the old version's calls ended in a swap.
func drainText(r host.ReloadResult) string {
	if !r.Drained {
		return fmt.Sprintf("old version stopped after the %s drain limit; the jobs it still ran stay pending and run again", roundDuration(r.DrainTime))
	}
	return fmt.Sprintf("old version's calls finished in %s", roundDuration(r.DrainTime))
}

const manifestHelp = `--migrations DIR names the plugin's migrations: goose-style NNNNN_name.sql
files, applied in the plugin's own schema plugin_NAME. DIR must be a
directory beside the binary (copy it there); the manifest records its name
and migrations_sha256, the checksum an install verifies.

--grants FILE is a JSON array of the plugin's privileges on the
application's tables, column by column, as the manifest holds them:
  [{"table": "wallets", "select": ["id", "balance"], "update": ["balance"]}]
--grant TABLE:select=a,b;update=c;insert=d adds one table's (repeat it).`

const installHelp = `Run as the runtime's owner (--database-url), after the application's
tables exist and an administrator ran host setup --plugin NAME. For each
plugin: its binary and migrations must match the manifest's checksums; its
migrations not yet applied run as usher_schema_NAME in its schema
plugin_NAME (a migration that switches role, grants, or touches anything
outside the schema is refused and leaves nothing); its role gets exactly
the grants the manifest declares, and those no longer declared are revoked.
A second install of the same manifest changes nothing. host run does the
same for every plugin it loads from --plugin-dir.`

func (cl *cli) pluginsManifest(fs *flag.FlagSet) runner {
	name := fs.String("name", "", "the plugin's name, as it reports it (required)")
	version := fs.String("version", "", "the plugin's version, as it reports it (required)")
	write := fs.Bool("write", false, "write NAME.plugin.json beside the binary instead of printing it")
	var kinds, enqueues, grantSpecs listFlag
	fs.Var(&kinds, "kind", "a kind the plugin serves (repeat for each; at least one)")
	fs.Var(&enqueues, "enqueue", "a kind of another plugin its handlers may enqueue (repeat for each)")
	migrationsDir := fs.String("migrations", "", "the plugin's migrations: a directory of NNNNN_name.sql files beside the binary")
	grantsFile := fs.String("grants", "", "a JSON file of the plugin's grants on the application's tables")
	fs.Var(&grantSpecs, "grant", "one table's grants, TABLE:select=a,b;update=c;insert=d (repeat for each table)")
	return func(ctx context.Context, pos []string) error {
		extra, err := manifestExtras(pos, *migrationsDir, *grantsFile, grantSpecs)
		if err != nil {
			return err
		}
		return cl.manifest(ctx, pos, *name, *version, kinds, enqueues, *write, extra)
	}
}

// manifestExtras reads the plugin's migrations and grants from the flags.
func manifestExtras(pos []string, migrationsDir, grantsFile string, grantSpecs []string) (pluginhost.FileManifest, error) {
	var m pluginhost.FileManifest
	if migrationsDir != "" && len(pos) == 1 {
		abs, err := filepath.Abs(migrationsDir)
		if err != nil {
			return m, err
		}
		binDir, err := filepath.Abs(filepath.Dir(pos[0]))
		if err != nil {
			return m, err
		}
		if filepath.Dir(abs) != binDir {
			return m, fmt.Errorf("--migrations %s must be a directory beside the binary, in %s: copy it there (the manifest names it relative to itself)", migrationsDir, binDir)
		}
		m.Migrations = filepath.Base(abs)
		if m.MigrationsSHA256, err = pluginhost.MigrationsSHA256(os.DirFS(abs)); err != nil {
			return m, err
		}
	}
	if grantsFile != "" {
		gs, err := pluginhost.ReadGrants(grantsFile)
		if err != nil {
			return m, err
		}
		m.Grants = gs
	}
	for _, s := range grantSpecs {
		g, err := parseGrant(s)
		if err != nil {
			return m, usageError{err.Error()}
		}
		m.Grants = append(m.Grants, g)
	}
	return m, nil
}

// parseGrant reads --grant TABLE:select=a,b;update=c;insert=d.
func parseGrant(s string) (pluginhost.Grant, error) {
	table, privs, ok := strings.Cut(s, ":")
	g := pluginhost.Grant{Table: table}
	if !ok || table == "" || privs == "" {
		return g, fmt.Errorf("--grant %q: want TABLE:select=a,b;update=c;insert=d", s)
	}
	for _, p := range strings.Split(privs, ";") {
		kind, cols, ok := strings.Cut(p, "=")
		if !ok || cols == "" {
			return g, fmt.Errorf("--grant %q: %q is not PRIVILEGE=col,col", s, p)
		}
		list := strings.Split(cols, ",")
		switch strings.ToLower(kind) {
		case "select":
			g.Select = append(g.Select, list...)
		case "update":
			g.Update = append(g.Update, list...)
		case "insert":
			g.Insert = append(g.Insert, list...)
		default:
			return g, fmt.Errorf("--grant %q: privilege %q is not select, update or insert", s, kind)
		}
	}
	return g, nil
}

func (cl *cli) manifest(ctx context.Context, pos []string, name, version string, kinds, enqueues []string, write bool, extra pluginhost.FileManifest) error {
	if len(pos) != 1 || name == "" || version == "" || len(kinds) == 0 {
		return usageError{"usage: host plugins manifest BINARY --name NAME --version VERSION --kind KIND [--kind KIND ...] [--enqueue KIND ...] [--migrations DIR] [--grants FILE] [--grant TABLE:select=a,b;update=c ...] [--write]"}
	}
	m, err := pluginhost.NewFileManifest(pos[0], name, version, kinds)
	if err != nil {
		return err
	}
	// What the manifest says must be what the binary says.
	got, err := pluginhost.Probe(ctx, pos[0])
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	var served []string
	for _, k := range got.Kinds {
		served = append(served, k.Kind)
	}
	slices.Sort(served)
	want := slices.Sorted(slices.Values(kinds))
	switch {
	case got.Name != name || got.Version != version:
		return fmt.Errorf("%s reports plugin %q version %q, not %q version %q; refusing to write that manifest", pos[0], got.Name, got.Version, name, version)
	case !slices.Equal(served, slices.Compact(want)):
		return fmt.Errorf("%s serves kinds %v, not %v; refusing to write that manifest", pos[0], served, slices.Compact(want))
	}
	m.Enqueues = enqueues
	m.Migrations, m.MigrationsSHA256, m.Grants = extra.Migrations, extra.MigrationsSHA256, extra.Grants
	if write {
		path, err := m.Write(filepath.Dir(pos[0]))
		if err != nil {
			return err
		}
		fmt.Fprintf(cl.stdout, "%s: %s %s sha256 %s\n", path, m.Name, m.Version, m.SHA256)
		return nil
	}
	return writeJSON(cl.stdout, m)
}

func (cl *cli) pluginsInstall(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	dir := fs.String("plugin-dir", env("USHER_PLUGIN_DIR", ""), "the directory of plugin binaries and their manifests (USHER_PLUGIN_DIR; required)")
	return func(ctx context.Context, pos []string) error {
		if *dir == "" {
			return usageError{"usage: host plugins install --plugin-dir DIR [--database-url URL] [NAME ...]"}
		}
		scan, err := pluginhost.ScanDir(*dir)
		if err != nil {
			return err
		}
		for _, p := range scan.Problems {
			fmt.Fprintf(cl.stderr, "skipped: %v\n", p)
		}
		var chosen []pluginhost.DirPlugin
		for _, p := range scan.Plugins {
			if len(pos) == 0 || slices.Contains(pos, p.Manifest.Name) {
				chosen = append(chosen, p)
			}
		}
		for _, n := range pos {
			if !slices.ContainsFunc(chosen, func(p pluginhost.DirPlugin) bool { return p.Manifest.Name == n }) {
				return fmt.Errorf("no manifest in %s names plugin %q", *dir, n)
			}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			var failed []string
			for _, p := range chosen {
				if err := cl.installOne(ctx, pool, p); err != nil {
					fmt.Fprintf(cl.stdout, "%s: refused: %v\n", p.Manifest.Name, err)
					failed = append(failed, p.Manifest.Name)
				}
			}
			if len(failed) > 0 {
				return fmt.Errorf("install refused for %s", strings.Join(failed, ", "))
			}
			return nil
		})
	}
}

func (cl *cli) installOne(ctx context.Context, pool *pgxpool.Pool, p pluginhost.DirPlugin) error {
	if err := plugindb.VerifyBinary(p); err != nil {
		return err
	}
	spec, err := plugindb.FromManifest(p)
	if err != nil {
		return err
	}
	res, err := plugindb.Install(ctx, pool, spec)
	if err != nil {
		return err
	}
	if res.Unchanged {
		_, err = fmt.Fprintf(cl.stdout, "%s %s: unchanged\n", p.Manifest.Name, p.Manifest.Version)
		return err
	}
	fmt.Fprintf(cl.stdout, "%s %s: installed (%d migration(s) applied", p.Manifest.Name, p.Manifest.Version, len(res.Applied))
	for _, a := range res.Applied {
		fmt.Fprintf(cl.stdout, " %s", a)
	}
	fmt.Fprintln(cl.stdout, ")")
	for _, g := range res.Granted {
		fmt.Fprintf(cl.stdout, "  granted %s\n", g)
	}
	for _, t := range res.Revoked {
		fmt.Fprintf(cl.stdout, "  revoked on %s (no longer in the manifest)\n", t)
	}
	return nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*l = append(*l, v)
	return nil
}

// roundDuration prints d to a precision that says something: a drain of
// 40 µs is "40µs", not "0s"; one of 30.0014 s is "30s".
func roundDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(100 * time.Millisecond).String()
	}
}

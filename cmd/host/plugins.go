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
	"strings"
	"text/tabwriter"
	"time"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/pluginhost"
)

const pluginsUsage = `usage: host plugins [list] [--admin-addr ADDR] [--admin-token-file FILE]
       host plugins reload [NAME] [--admin-addr ADDR] [--admin-token-file FILE] [--timeout D]
       host plugins rollback NAME [--admin-addr ADDR] [--admin-token-file FILE] [--timeout D]
       host plugins manifest BINARY --name NAME --version VERSION --kind KIND [--kind KIND ...] [--enqueue KIND ...] [--write]

  list      the plugins a running host serves
  reload    ask a running host to re-read its plugin directory's manifests
            and load or hot-swap what changed (only NAME when given);
            exits non-zero when a load or swap was refused
  rollback  ask a running host to swap NAME back to the version its last
            swap replaced; the manifest rolled back from is refused until
            it changes (or a reload asks for it)
  manifest  print BINARY's manifest (name, version, binary, SHA-256);
            --write writes it beside the binary as NAME.plugin.json

list, reload and rollback send the host's admin token: USHER_ADMIN_TOKEN, else the
file --admin-token-file names (default $XDG_STATE_HOME/usher/admin-token,
else ~/.local/state/usher/admin-token, the file a host creates by default).
Flags come after the subcommand.`

func cmdPlugins(ctx context.Context, args []string) error {
	sub := "list"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "list":
		return pluginsList(ctx, args)
	case "reload":
		return pluginsReload(ctx, args)
	case "rollback":
		return pluginsRollback(ctx, args)
	case "manifest":
		return pluginsManifest(args)
	case "help":
		fmt.Println(pluginsUsage)
		return nil
	default:
		return fmt.Errorf("unknown plugins subcommand %q\n%s", sub, pluginsUsage)
	}
}

// parseInterleaved parses flags that may come before or after the
// positional arguments (host plugins reload counters --admin-addr X) and
// returns the positional ones. After "--" everything is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

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
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, nil)
	if err != nil {
		return nil, err
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

func pluginsList(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("plugins list", flag.ContinueOnError)
	var c adminClient
	c.register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("list takes no arguments, got %q (flags go after the subcommand)", pos)
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
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tVERSION\tPROTOCOL\tPID\tHEALTHY\tRESTARTS\tPARKED\tDB ROLE\tVERIFIED\tKINDS")
	for _, p := range list {
		role, verified := p.DBRole, "no manifest"
		if role == "" {
			role = "(host's)"
		}
		if p.SHA256 != "" {
			verified = "sha256 " + p.SHA256[:12] + "…"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%v\t%d\t%d\t%s\t%s\t%v\n", p.Name, p.Version, p.Protocol, p.Pid, p.Healthy, p.Restarts,
			p.Parked, role, verified, p.Kinds)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, p := range list {
		if p.ProbationUntil != nil {
			fmt.Printf("%s: %s on probation until %s (rolled back to %s if it fails)\n", p.Name, p.Version,
				p.ProbationUntil.Format(time.RFC3339), p.Previous)
		}
		if r := p.LastRollback; r != nil {
			fmt.Printf("%s: rolled back %s -> %s at %s (%s): %s\n", p.Name, r.From, r.To, r.At.Format(time.RFC3339), r.Cause, r.Reason)
		}
		if p.Refused != "" {
			fmt.Printf("%s: %s refused: %s\n", p.Name, p.Refused, p.RefusedReason)
		}
	}
	return nil
}

func pluginsReload(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("plugins reload", flag.ContinueOnError)
	var c adminClient
	c.register(fs)
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the host's answer (a swap drains in-flight jobs first)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("reload takes at most one plugin name, got %q", pos)
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %s", *timeout)
	}
	if err := c.load(); err != nil {
		return err
	}
	path := "/plugins/reload"
	if len(pos) == 1 {
		path += "?name=" + url.QueryEscape(pos[0])
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out host.ReloadResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return fmt.Errorf("host answered %s: %w", resp.Status, err)
	}
	if out.Error != "" {
		return errors.New(out.Error)
	}
	refused := 0
	for _, r := range out.Results {
		switch r.Action {
		case "swapped":
			fmt.Printf("%s: swapped %s -> %s (new version up in %s, %s)\n", r.Plugin, r.From, r.To,
				roundDuration(r.StartTime), drainText(r))
		case "loaded":
			fmt.Printf("%s: loaded %s\n", r.Plugin, r.To)
		case "unchanged":
			fmt.Printf("%s: unchanged (%s)\n", r.Plugin, r.From)
		default:
			refused++
			from := r.From
			if from == "" {
				from = "not loaded"
			}
			fmt.Printf("%s: %s refused, %s keeps serving: %s\n", r.Plugin, r.To, from, r.Error)
		}
	}
	if refused > 0 {
		return fmt.Errorf("%d plugin(s) refused", refused)
	}
	return nil
}

func pluginsRollback(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("plugins rollback", flag.ContinueOnError)
	var c adminClient
	c.register(fs)
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the host's answer (a rollback drains in-flight jobs first)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("rollback takes one plugin name, got %q", pos)
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %s", *timeout)
	}
	if err := c.load(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, "/plugins/rollback?name="+url.QueryEscape(pos[0]))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out host.ReloadResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return fmt.Errorf("host answered %s: %w", resp.Status, err)
	}
	if out.Error != "" {
		return errors.New(out.Error)
	}
	for _, r := range out.Results {
		fmt.Printf("%s: rolled back %s -> %s (previous version up in %s, %s)\n", r.Plugin, r.From, r.To,
			roundDuration(r.StartTime), drainText(r))
	}
	return nil
}

// drainText says how the old version's calls ended in a swap.
func drainText(r host.ReloadResult) string {
	if !r.Drained {
		return fmt.Sprintf("old version stopped after the %s drain limit; the jobs it still ran stay pending and run again", roundDuration(r.DrainTime))
	}
	return fmt.Sprintf("old version's calls finished in %s", roundDuration(r.DrainTime))
}

func pluginsManifest(args []string) error {
	fs := flag.NewFlagSet("plugins manifest", flag.ContinueOnError)
	name := fs.String("name", "", "the plugin's name, as it reports it (required)")
	version := fs.String("version", "", "the plugin's version, as it reports it (required)")
	write := fs.Bool("write", false, "write NAME.plugin.json beside the binary instead of printing it")
	var kinds, enqueues listFlag
	fs.Var(&kinds, "kind", "a kind the plugin serves (repeat for each; at least one)")
	fs.Var(&enqueues, "enqueue", "a kind of another plugin its handlers may enqueue (repeat for each)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *name == "" || *version == "" || len(kinds) == 0 {
		return errors.New("usage: host plugins manifest BINARY --name NAME --version VERSION --kind KIND [--kind KIND ...] [--enqueue KIND ...] [--write]")
	}
	m, err := pluginhost.NewFileManifest(pos[0], *name, *version, kinds)
	if err != nil {
		return err
	}
	m.Enqueues = enqueues
	if *write {
		path, err := m.Write(filepath.Dir(pos[0]))
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s %s sha256 %s\n", path, m.Name, m.Version, m.SHA256)
		return nil
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(m)
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

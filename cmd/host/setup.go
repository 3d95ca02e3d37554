package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
)

// cmdSetup is the one step that needs a database administrator: it creates
// the runtime's owner role (the host's login, no superuser) and a login
// role per plugin, on the database the admin URL names.
func (cl *cli) setupFlags(fs *flag.FlagSet) runner {
	adminURL := fs.String("admin-url", "", "an administrator's URL (superuser or CREATEROLE) for the database to set up (required)")
	deployment := fs.String("deployment", "", "this deployment's name, for a Postgres cluster that holds more than one usher database: its roles are then usher_<deployment>_... and recorded on the database, where its hosts find them (default: none, roles usher and usher_plugin_<name>)")
	owner := fs.String("owner", "", "the runtime's owner role: the host's login (default usher, or usher_<deployment>)")
	passfile := fs.String("passfile", "", "give each role created a random password and record it in this passfile (libpq format, mode 0600); empty: no passwords (trust or certificate authentication)")
	connLimit := fs.Int("plugin-connection-limit", sandbox.DefaultPluginConnectionLimit, "CONNECTION LIMIT of every plugin role: the sessions it may hold, all hosts' pools together (at least hosts x --plugin-pool-size); -1: none")
	adopt := fs.Bool("adopt", false, "take over existing roles that carry no deployment's mark although another database uses them (a deployment set up before deployments were named)")
	var plugins listFlag
	fs.Var(&plugins, "plugin", "a plugin whose login role usher_plugin_<name> to create (repeat for each)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 || *adminURL == "" {
			return usageError{"usage: host setup --admin-url URL [--deployment NAME] [--owner NAME] [--plugin NAME ...] [--passfile FILE] [--plugin-connection-limit N] [--adopt]"}
		}
		if *connLimit == 0 {
			return usageError{"--plugin-connection-limit 0 would let no plugin log in; -1 sets no limit"}
		}
		cfg := sandbox.SetupConfig{Deployment: *deployment, Owner: *owner, Plugins: plugins, PluginConnectionLimit: *connLimit, Adopt: *adopt}
		return cl.setup(ctx, *adminURL, *passfile, cfg)
	}
}

func (cl *cli) setup(ctx context.Context, adminURL, passfile string, cfg sandbox.SetupConfig) error {
	if err := sandbox.CheckDeployment(cfg.Deployment); err != nil {
		return usageError{err.Error()}
	}
	if cfg.Owner == "" {
		cfg.Owner = sandbox.OwnerIn(cfg.Deployment)
	}
	owner, plugins := cfg.Owner, cfg.Plugins
	admin, err := connectCreating(ctx, adminURL, cl.stdout)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	defer admin.Close(ctx)
	cfg.PluginPasswords = map[string]string{}
	var entries []string
	cc := admin.Config()
	entry := func(role, pw string) string {
		return strings.Join([]string{passEscape(cc.Host), fmt.Sprint(cc.Port), passEscape(cc.Database), passEscape(role), passEscape(pw)}, ":")
	}
	if passfile != "" {
		cfg.OwnerPassword = newPassword()
		entries = append(entries, entry(owner, cfg.OwnerPassword))
		for _, p := range plugins {
			pw := newPassword()
			cfg.PluginPasswords[p] = pw
			entries = append(entries, entry(sandbox.PluginRoleIn(cfg.Deployment, p), pw))
		}
	}
	if err := sandbox.Setup(ctx, admin, cfg); err != nil {
		return err
	}
	if passfile != "" {
		if err := writePassfile(passfile, entries); err != nil {
			return err
		}
	}
	if cfg.Deployment != "" {
		fmt.Fprintf(cl.stdout, "deployment %s (recorded on database %s)\n", cfg.Deployment, cc.Database)
	}
	fmt.Fprintf(cl.stdout, "owner %s (the host's login, no superuser)\n", owner)
	for _, p := range plugins {
		fmt.Fprintf(cl.stdout, "plugin %s: login role %s\n", p, sandbox.PluginRoleIn(cfg.Deployment, p))
	}
	if passfile != "" {
		fmt.Fprintf(cl.stdout, "passwords in %s: run the host with PGPASSFILE=%s\n", passfile, passfile)
	}
	return nil
}

func newPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func passEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(s)
}

// writePassfile replaces the lines for the same host, port, database and
// role in path and adds the others, keeping the file 0600.
func writePassfile(path string, entries []string) error {
	key := func(line string) string {
		if i := strings.LastIndex(line, ":"); i > 0 {
			return line[:i]
		}
		return line
	}
	fresh := map[string]bool{}
	for _, e := range entries {
		fresh[key(e)] = true
	}
	var kept []string
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if !fresh[key(sc.Text())] {
				kept = append(kept, sc.Text())
			}
		}
		f.Close()
	}
	out := strings.Join(append(kept, entries...), "\n") + "\n"
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(out), 0o600); err != nil {
		return fmt.Errorf("setup: passfile: %w", err)
	}
	return os.Rename(tmp, path)
}

// setupUsersFlags is `host setup-users`: an OS user of its own for each
// plugin, for `host run --plugin-user` to start it as (run as root).
func (cl *cli) setupUsersFlags(fs *flag.FlagSet) runner {
	pattern := fs.String("plugin-user", pluginhost.DefaultUserPattern, "the users' names, {name} the plugin's (as host run's --plugin-user)")
	var plugins listFlag
	fs.Var(&plugins, "plugin", "a plugin whose OS user to create (repeat for each)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 || len(plugins) == 0 {
			return usageError{"usage: host setup-users --plugin NAME [--plugin NAME ...] [--plugin-user PATTERN]"}
		}
		if !strings.Contains(*pattern, pluginhost.NamePlaceholder) {
			return usageError{fmt.Sprintf("--plugin-user %q has no %s: the plugins would share one user and could signal each other", *pattern, pluginhost.NamePlaceholder)}
		}
		for _, p := range plugins {
			name := pluginhost.UserFor(*pattern, p)
			created, err := pluginhost.UserAdd(name)
			if err != nil {
				return fmt.Errorf("setup-users: %w", err)
			}
			what := "exists"
			if created {
				what = "created"
			}
			fmt.Fprintf(cl.stdout, "plugin %s: OS user %s (%s)\n", p, name, what)
		}
		return nil
	}
}

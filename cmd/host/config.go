package main

import (
	"errors"
	"flag"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/admin"
)

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envDuration(k string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(k)); err == nil {
		return d
	}
	return def
}

func envInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return n
	}
	return def
}

// connFlags are the flags every command that talks to the stores takes.
type connFlags struct {
	databaseURL, redisURL, stream, group string
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.databaseURL, "database-url", env("DATABASE_URL", "postgres://usher@127.0.0.1:5432/test?sslmode=disable"), "Postgres URL, logged in as the runtime's owner (DATABASE_URL)")
	fs.StringVar(&c.redisURL, "redis-url", env("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (REDIS_URL)")
	fs.StringVar(&c.stream, "stream", env("USHER_STREAM", "usher:{jobs}"), "stream key (USHER_STREAM)")
	fs.StringVar(&c.group, "group", env("USHER_GROUP", "usher"), "consumer group (USHER_GROUP)")
}

// hostFlags fill a host.Config.
func hostFlags(fs *flag.FlagSet) (*connFlags, *host.Config, *string) {
	c := &connFlags{}
	c.register(fs)
	cfg := &host.Config{}
	plugins := fs.String("plugins", env("USHER_PLUGINS", ""), "comma-separated plugin binaries (USHER_PLUGINS)")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", env("USHER_PLUGIN_DIR", ""), "directory of plugin binaries (USHER_PLUGIN_DIR)")
	fs.StringVar(&cfg.Consumer, "consumer", env("USHER_CONSUMER", ""), "consumer name, unique per host (USHER_CONSUMER; default hostname-pid)")
	fs.DurationVar(&cfg.ReclaimIdle, "reclaim-idle", envDuration("USHER_RECLAIM_IDLE", 60*time.Second), "reclaim entries idle longer than this (USHER_RECLAIM_IDLE)")
	fs.IntVar(&cfg.Concurrency, "concurrency", envInt("USHER_CONCURRENCY", 16), "jobs in flight (USHER_CONCURRENCY)")
	fs.DurationVar(&cfg.JobTimeout, "job-timeout", envDuration("USHER_JOB_TIMEOUT", 30*time.Second), "deadline of one handler run (USHER_JOB_TIMEOUT)")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", env("USHER_ADMIN_ADDR", "127.0.0.1:9464"), "admin/metrics listen address, empty to disable (USHER_ADMIN_ADDR)")
	fs.Func("admin-allowed-hosts", "comma-separated names the admin API also answers to in Host/Origin, name or name:port (USHER_ADMIN_ALLOWED_HOSTS)",
		func(v string) error { cfg.AdminAllowedHosts = splitList(v); return nil })
	cfg.AdminAllowedHosts = splitList(os.Getenv("USHER_ADMIN_ALLOWED_HOSTS"))
	fs.DurationVar(&cfg.ReconcileAfter, "reconcile-after", envDuration("USHER_RECONCILE_AFTER", 15*time.Minute), "republish outbox rows published this long ago with no outcome (USHER_RECONCILE_AFTER)")
	fs.DurationVar(&cfg.ReconcileInterval, "reconcile-interval", envDuration("USHER_RECONCILE_INTERVAL", time.Minute), "how often to look for them (USHER_RECONCILE_INTERVAL)")
	fs.BoolVar(&cfg.AllowSuperuser, "allow-superuser", false, "run even when the database login is a superuser (refused by default: plugins run untrusted code)")
	fs.IntVar(&cfg.PluginPoolSize, "plugin-pool-size", envInt("USHER_PLUGIN_POOL_SIZE", 0), "Postgres connections per plugin, each logged in as the plugin's role (USHER_PLUGIN_POOL_SIZE; default --concurrency)")
	fs.BoolVar(&cfg.DisableRelay, "no-relay", false, "do not run the outbox relay in this process")
	fs.BoolVar(&cfg.DisableScheduler, "no-scheduler", false, "do not run the scheduler in this process")
	return c, cfg, plugins
}

func (c *connFlags) apply(cfg *host.Config, plugins string) {
	cfg.DatabaseURL, cfg.RedisURL, cfg.Stream, cfg.Group = c.databaseURL, c.redisURL, c.stream, c.group
	cfg.Plugins = append(cfg.Plugins, splitList(plugins)...)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// tokenFlags is where the admin token comes from, for `run` (the host's)
// and `plugins` (the client's): USHER_ADMIN_TOKEN holds the token itself;
// else --admin-token-file names the file, by default admin.DefaultTokenFile.
// Both at once is an error, never a silent choice.
type tokenFlags struct {
	fs   *flag.FlagSet
	file string
}

func (t *tokenFlags) register(fs *flag.FlagSet) {
	t.fs = fs
	fs.StringVar(&t.file, "admin-token-file", "", "file holding the admin API's token (default $XDG_STATE_HOME/usher/admin-token, "+
		"else ~/.local/state/usher/admin-token); USHER_ADMIN_TOKEN gives the token itself instead")
}

// resolve returns the token from the environment, or the file to read it
// from; call it after the flags are parsed.
func (t *tokenFlags) resolve() (token, file string, err error) {
	explicit := false
	t.fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "admin-token-file" })
	if explicit && t.file == "" {
		return "", "", errors.New("--admin-token-file needs a path")
	}
	if tok := os.Getenv("USHER_ADMIN_TOKEN"); tok != "" {
		if explicit {
			return "", "", errors.New("both USHER_ADMIN_TOKEN and --admin-token-file are given: use one")
		}
		return tok, "", nil
	}
	if t.file != "" {
		return "", t.file, nil
	}
	file, err = admin.DefaultTokenFile()
	return "", file, err
}

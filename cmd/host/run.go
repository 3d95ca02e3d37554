package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/migrations"
	"github.com/usherhq/usher/plugins/stagedoor/appdb"
)

func (cl *cli) runFlags(fs *flag.FlagSet) runner {
	var f hostFlags
	f.register(fs)
	var tf tokenFlags
	tf.register(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("run takes no arguments, got %q", pos)}
		}
		return serve(ctx, &f, &tf)
	}
}

func serve(ctx context.Context, f *hostFlags, tf *tokenFlags) error {
	if err := undumpable(); err != nil {
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	if cfg.AdminAddr != "" {
		if cfg.AdminToken, cfg.AdminTokenFile, err = tf.resolve(); err != nil {
			return err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if f.signingKeyFile != "" {
		cfg.Logger.Info("stream signing key read from a file", "path", f.signingKeyFile)
	}
	switch {
	case cfg.PluginUser == "":
		cfg.Logger.Warn("plugins run as the host's own OS user: a plugin can read the host's files and signal it and every other plugin; " +
			"run each as its own user (host setup-users, --plugin-user " + pluginhost.DefaultUserPattern + ")")
	case !strings.Contains(cfg.PluginUser, pluginhost.NamePlaceholder):
		cfg.Logger.Warn("every plugin runs as the same OS user: a plugin can signal and read every other plugin; "+
			"run each as its own user (host setup-users, --plugin-user "+pluginhost.DefaultUserPattern+")", "plugin_user", cfg.PluginUser)
	}
	h, err := host.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer h.Close()
	warnPasswordless(ctx, cfg.Logger, h)
	return h.Run(ctx)
}

// warnPasswordless warns of each plugin role the server lets in with no
// password from this machine (trust authentication): a plugin running
// here can then log in by itself, and nothing the host does stops it.
func warnPasswordless(ctx context.Context, log *slog.Logger, h *host.Host) {
	for _, p := range h.Plugins() {
		open, err := sandbox.LogsInWithoutPassword(ctx, h.Pool().Config().ConnConfig, p.DBRole)
		if err != nil {
			log.Warn("could not check whether a plugin's role logs in without a password", "plugin", p.Name, "role", p.DBRole, "err", err)
			continue
		}
		if open {
			log.Warn("postgres lets this plugin's role log in from this machine without a password (trust authentication): the plugin can open sessions of its own, outside the host's transactions, deadlines and pools; "+
				"require scram-sha-256 for the plugin roles in pg_hba.conf (docs/security.md)", "plugin", p.Name, "role", p.DBRole)
		}
	}
}

func (cl *cli) migrateFlags(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	stagedoor := fs.Bool("stagedoor", false, "also apply the Stagedoor example application's own migrations (its tables: events, orders, tickets, counter_applies)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("migrate takes no arguments, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			if err := migrations.Up(ctx, pool); err != nil {
				return err
			}
			if _, err := fmt.Fprintln(cl.stdout, "migrations applied"); err != nil || !*stagedoor {
				return err
			}
			if err := appdb.Migrate(ctx, pool); err != nil {
				return err
			}
			_, err := fmt.Fprintln(cl.stdout, "stagedoor migrations applied")
			return err
		})
	}
}

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/migrations"
)

func cmdRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var f hostFlags
	f.register(fs)
	var tf tokenFlags
	tf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("run takes no arguments, got %q", fs.Args())
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
	h, err := host.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer h.Close()
	return h.Run(ctx)
}

func cmdMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	conn := &connFlags{}
	conn.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, conn.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		return err
	}
	fmt.Println("migrations applied")
	return nil
}

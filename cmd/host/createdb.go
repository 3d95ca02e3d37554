package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connectCreating connects to url's database, first creating it (from the
// server's postgres database, as url's user) when it does not exist: setup
// on a fresh server needs no createdb before it. It says so on out.
func connectCreating(ctx context.Context, url string, out io.Writer) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, url)
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) || pg.Code != "3D000" { // invalid_catalog_name
		return conn, err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	name := cfg.Database
	cfg.Database = "postgres"
	m, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database %q does not exist, and the postgres database to create it from could not be reached: %w", name, err)
	}
	_, err = m.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	_ = m.Close(ctx)
	if err != nil && !(errors.As(err, &pg) && pg.Code == "42P04") { // duplicate_database: created meanwhile
		return nil, fmt.Errorf("database %q does not exist, and creating it failed: %w", name, err)
	}
	if err == nil {
		fmt.Fprintf(out, "created database %s\n", name)
	}
	return pgx.Connect(ctx, url)
}

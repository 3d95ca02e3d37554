// Package migrations holds usher's versioned SQL: the runtime's tables and
// the Stagedoor example's tables. The files are embedded in every binary and
// applied with goose by `host migrate` and at the start of `host run`.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

//go:embed grants/stagedoor.sql
var stagedoorGrants string

// Up applies every migration not yet applied, then the Stagedoor plugins'
// grants to whichever of their roles exist (GRANT is idempotent, so a role
// created since the last run gets them now). Concurrent callers are
// serialised by goose's Postgres session lock, so several hosts starting at
// once migrate once.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := up(ctx, db); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, stagedoorGrants); err != nil {
		return fmt.Errorf("migrations: grants to the Stagedoor plugins' roles: %w", err)
	}
	return nil
}

func up(ctx context.Context, db *sql.DB) error {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

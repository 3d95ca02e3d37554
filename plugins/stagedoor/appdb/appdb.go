// Package appdb is the Stagedoor application's own database: its tables
// (events, orders, tickets, counter_applies), applied with goose and
// tracked in their own version table, stagedoor_db_version, apart from the
// runtime's. The runtime's migrations hold only the runtime's tables; an
// application migrates its own, before the plugins whose grants name them
// are installed. `host migrate --stagedoor` runs Migrate.
//
// The send claim's table, email_sends, is not here: it is the tickets
// plugin's, in its own schema (plugins/tickets/db).
package appdb

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var files embed.FS

// VersionTable is where goose records Stagedoor's applied migrations.
const VersionTable = "stagedoor_db_version"

// Migrate applies Stagedoor's migrations not yet applied, as pool's login
// (the tables' owner; the runtime's owner in the demo and the tests). A
// database whose Stagedoor tables the runtime's migrations created before
// they moved here keeps them and their rows: every statement is IF NOT
// EXISTS. Concurrent callers are serialised by goose's session lock.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(5887940537704921958))
	if err != nil {
		return fmt.Errorf("stagedoor: migrations: %w", err)
	}
	sub, err := fs.Sub(files, "migrations")
	if err != nil {
		return err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithSessionLocker(locker), goose.WithTableName(VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("stagedoor: migrations: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("stagedoor: migrations: up: %w", err)
	}
	return nil
}

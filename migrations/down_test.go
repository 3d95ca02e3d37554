package migrations_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/migrations"
)

// The Down of the latest migration that changes functions brings the
// runtime's functions back as the migration before it made them: their
// bodies, settings (a function replaced with CREATE OR REPLACE loses its
// search_path) and grants. (A later migration of data only changes none.)
func TestLatestDownRestoresFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := hosttest.EmptyDB(t)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files)
	require.NoError(t, err)
	sources := p.ListSources()
	require.GreaterOrEqual(t, len(sources), 2)
	i := len(sources) - 1
	for ; i > 0; i-- {
		sql, err := fs.ReadFile(migrations.Files, filepath.Base(sources[i].Path))
		require.NoError(t, err)
		if strings.Contains(strings.ToUpper(string(sql)), "FUNCTION") {
			break
		}
	}
	require.Positive(t, i, "no migration changes a function")
	latest, before := sources[i].Version, sources[i-1].Version

	_, err = p.UpTo(ctx, before)
	require.NoError(t, err)
	was := functions(t, pool)
	_, err = p.UpTo(ctx, latest)
	require.NoError(t, err)
	require.NotEqual(t, was, functions(t, pool), "migration %d changes no function", latest)
	_, err = p.DownTo(ctx, before)
	require.NoError(t, err)
	now := functions(t, pool)
	for name := range now {
		_, ok := was[name]
		assert.True(t, ok, "%s is left after the Down", name)
	}
	for name, desc := range was {
		assert.Equal(t, desc, now[name], "%s after the Down", name)
	}
	_, err = p.Up(ctx)
	require.NoError(t, err)
}

// functions describes every function of the runtime's schema.
func functions(t *testing.T, pool *pgxpool.Pool) map[string]string {
	rows, err := pool.Query(context.Background(), `
		SELECT p.oid::regprocedure::text,
		       p.prosrc || ' config ' || coalesce(p.proconfig::text, '') || ' acl ' || coalesce(p.proacl::text, '')
		             || ' definer ' || p.prosecdef::text
		FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace`)
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var name, desc string
		require.NoError(t, rows.Scan(&name, &desc))
		got[name] = desc
	}
	require.NoError(t, rows.Err())
	return got
}

package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/migrations"
)

// 00060 (the job actions) goes down to the functions 00055 left, and up
// again to the latest.
func TestJobActionsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := hosttest.EmptyDB(t)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 55)
	require.NoError(t, err)
	was := functions(t, pool)
	_, err = p.UpTo(ctx, 60)
	require.NoError(t, err)
	require.NotEqual(t, was, functions(t, pool))
	_, err = p.DownTo(ctx, 55)
	require.NoError(t, err)
	require.Equal(t, was, functions(t, pool))
	_, err = p.Up(ctx)
	require.NoError(t, err)
}

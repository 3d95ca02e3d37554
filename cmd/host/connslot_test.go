package main

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// A server with no connection slot for the host says so, once: "host:"
// is not printed twice, and the server is not called unreachable.
func TestRunNoConnectionSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := hosttest.EmptyDB(t)
	role := "usher_full_" + hosttest.Suffix()
	admin, err := pgx.Connect(ctx, hosttest.DatabaseURL())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		_ = admin.Close(context.Background())
	})
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT 0")
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	_, stream := hosttest.Redis(t)
	r := runHost(t, hosttest.Build(t, "./cmd/host"), []string{"REDIS_URL=" + hosttest.RedisURL(), "USHER_STREAM=" + stream, "USHER_ADMIN_ADDR="},
		"run", "--database-url", u.String())
	require.Equal(t, 1, r.code, r.stderr)
	last := strings.TrimSpace(r.stderr[strings.LastIndex(strings.TrimSpace(r.stderr), "\n")+1:])
	require.True(t, strings.HasPrefix(last, "host: postgres refused the connection: no connection slot left (too many connections for role"), last)
	require.NotContains(t, r.stderr, "host: host:")
	require.NotContains(t, r.stderr, "unreachable")
	// The other commands say the same.
	r = runHost(t, hosttest.Build(t, "./cmd/host"), nil, "deadletters", "list", "--database-url", u.String())
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "host: postgres refused the connection: no connection slot left")
}

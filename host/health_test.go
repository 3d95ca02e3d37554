package host_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// /healthz tells the truth: unhealthy, with the reason, within seconds of
// the Redis primary serving the stream dying (and healthy again once its
// replica is promoted), and within seconds of Postgres refusing the
// host's connections.
func TestHealthzReportsUnreachableDependencies(t *testing.T) {
	t.Parallel()
	b := setupCluster(t)
	ctx := context.Background()
	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	health := func() (int, string) {
		code, _, body := adminCall{method: "GET", path: "/healthz"}.do(t, h.AdminAddr())
		return code, body
	}
	code, body := health()
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ok\n", body)

	// Redis: the stream's primary killed.
	primary := b.cluster.PrimaryFor(b.stream)
	b.cluster.Kill(primary)
	killed := time.Now()
	hosttest.Eventually(t, 10*time.Second, "/healthz to report Redis", func() bool {
		code, body = health()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "unhealthy: redis: ")
	})
	t.Logf("unhealthy %s after the primary's kill: %q", time.Since(killed), body)
	hosttest.Eventually(t, 30*time.Second, "/healthz ok once the replica is promoted", func() bool {
		code, _ = health()
		return code == http.StatusOK
	})
	t.Logf("healthy again %s after the kill", time.Since(killed))

	// Postgres: the database refuses new connections, and the host's are
	// ended.
	// From another database: one cannot refuse connections to one's own.
	u, err := url.Parse(hosttest.AdminURL(t, b.dbURL))
	require.NoError(t, err)
	u.Path = "/postgres"
	admin, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer admin.Close()
	var db string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db))
	_, err = admin.Exec(ctx, `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS false`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS true`) })
	cut := time.Now()
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	require.NoError(t, err)
	hosttest.Eventually(t, 10*time.Second, "/healthz to report Postgres", func() bool {
		code, body = health()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "unhealthy: postgres: ")
	})
	t.Logf("unhealthy %s after Postgres refused: %q", time.Since(cut), body)
	_, err = admin.Exec(ctx, `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS true`)
	require.NoError(t, err)
	hosttest.Eventually(t, 10*time.Second, "/healthz ok with Postgres back", func() bool {
		code, _ = health()
		return code == http.StatusOK
	})
}

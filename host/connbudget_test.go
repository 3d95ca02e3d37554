package host_test

import (
	"context"
	"log/slog"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
)

// The connection budget: a plugin's pool is sized from what the batcher
// needs (4), not from Concurrency (16, before: an idle host with the two
// shipped plugins held 37 connections), and the host logs at start the
// most it will hold. Its own pool's sessions are bounded like the
// plugins': idle_in_transaction_session_timeout (JobTimeout + 10s) and
// TCP keepalives.
func TestConnectionBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	ready := logWatch{Handler: hosttest.Logger(t, slog.LevelInfo).Handler(), prefix: "host ready", got: make(chan string, 1)}
	var attrs []slog.Attr
	cfg.Logger = slog.New(attrWatch{logWatch: ready, attrs: &attrs})
	h := hosttest.Start(t, cfg)
	require.Len(t, h.Plugins(), 1)
	for _, p := range h.Plugins() {
		require.EqualValues(t, host.DefaultPluginPoolSize, p.DBPoolSize, p.Name)
	}
	<-ready.got
	hostPool := int(h.Pool().Config().MaxConns)
	want := map[string]any{"host_pool_size": int64(hostPool), "plugin_pool_size": int64(4),
		"max_connections": int64(host.ConnectionBudget(hostPool, 1, 4))}
	got := map[string]any{}
	for _, a := range attrs {
		if _, ok := want[a.Key]; ok {
			got[a.Key] = a.Value.Any()
		}
	}
	require.Equal(t, want, got)
	require.Equal(t, hostPool+4, host.ConnectionBudget(hostPool, 1, 4))

	var idle, keepalive string
	require.NoError(t, h.Pool().QueryRow(context.Background(),
		`SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('tcp_keepalives_idle')`).Scan(&idle, &keepalive))
	require.Equal(t, "40s", idle)
	require.Equal(t, "30", keepalive)
}

// attrWatch records the attributes of the records logWatch hands on.
type attrWatch struct {
	logWatch
	attrs *[]slog.Attr
}

func (w attrWatch) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == w.prefix {
		r.Attrs(func(a slog.Attr) bool { *w.attrs = append(*w.attrs, a); return true })
	}
	return w.logWatch.Handle(ctx, r)
}

// A server with no connection slot for the host (SQLSTATE 53300: here the
// login's CONNECTION LIMIT, as with "remaining connection slots are
// reserved") is told apart from one that does not answer.
func TestNoConnectionSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	role := "usher_full_" + hosttest.Suffix()
	admin, err := pgx.Connect(ctx, hosttest.AdminURL(t, b.dbURL))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		_ = admin.Close(context.Background())
	})
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT 0")
	require.NoError(t, err)
	u, err := url.Parse(b.dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	cfg := b.config()
	cfg.DatabaseURL = u.String()
	_, err = host.New(ctx, cfg)
	require.Error(t, err)
	require.Contains(t, err.Error(), "host: postgres refused the connection: no connection slot left (too many connections for role")
	require.Contains(t, err.Error(), "SQLSTATE 53300")
	require.Contains(t, err.Error(), `docs/operating.md, "Connection budget"`)
	require.NotContains(t, err.Error(), "unreachable")
}

package history_test

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/sandbox"
)

// A plugin's role can neither write nor read the history table; through
// usher_applied_logged it can record only an applied run of an outbox row
// of a kind it serves, whose job it names.
func TestPluginRoleCannotWriteHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	role := sandbox.PluginRole("counters")
	require.NoError(t, sandbox.Prepare(ctx, pool, "counters", role, []string{"update_sales_counter"}, nil))
	ids, err := outbox.Add(ctx, pool,
		outbox.Message{Kind: "update_sales_counter", Payload: []byte(`{"order_id": 1}`)},
		outbox.Message{Kind: "render_tickets", Payload: []byte(`{"order_id": 1}`)})
	require.NoError(t, err)

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	conn, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	defer conn.Close(ctx)

	denied := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		var pg *pgconn.PgError
		require.True(t, errors.As(err, &pg), "%s: %v", sql, err)
		require.Equal(t, "42501", pg.Code, "%s: %v", sql, err)
	}
	denied(`INSERT INTO job_history (job_id, kind, verdict, started_at) VALUES ('1', 'update_sales_counter', 'applied', now())`)
	denied(`SELECT count(*) FROM job_history`)
	denied(`UPDATE job_history SET verdict = 'applied'`)
	denied(`DELETE FROM job_history`)
	denied(`TRUNCATE job_history`)
	denied(`SELECT count(*) FROM job_republishes`)
	denied(`INSERT INTO job_republishes (outbox_id, job_id, kind) VALUES (1, '1', 'update_sales_counter')`)
	denied(`SELECT count(*) FROM job_links`)
	denied(`INSERT INTO job_links (job_id, parent_job_id) VALUES ('1', '2')`)
	denied(`UPDATE job_links SET outcome = 'applied'`)
	denied(`UPDATE job_history SET committed_at = now()`)
	const logged = `SELECT usher_applied_logged($1, $2, $3, 0, 1, '', '', '', '', '', '', now())`
	// Another plugin's kind, and a job id that is not the row's.
	denied(logged, ids[1], "render_tickets", "2")
	denied(logged, ids[0], "update_sales_counter", "999")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM job_history`))

	// Its own kind's row: the one thing it may record, as applied.
	_, err = conn.Exec(ctx, logged, ids[0], "update_sales_counter", "1")
	require.NoError(t, err)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE verdict = 'applied' AND job_id = '1'`))
}

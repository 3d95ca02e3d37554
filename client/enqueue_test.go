package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/doctest"
	"github.com/usherhq/usher/internal/entry"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

type testBundle struct {
	pool  *pgxpool.Pool
	dbURL string
	event int64
}

// setup gives the test its own database and a host serving
// update_sales_counter (the counters plugin) on its own stream.
func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream,
		Plugins:     []string{hosttest.Build(t, "./plugins/counters")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond})
	ev, err := orders.CreateEvent(context.Background(), pool, "Event", "Stagedoor Hall")
	require.NoError(t, err)
	return &testBundle{pool: pool, dbURL: dbURL, event: ev}
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	return hosttest.Count(t, b.pool, sql, args...)
}

// waitSeats waits until the event's counter is seats and every job in the
// outbox has finished, applied.
func (b *testBundle) waitSeats(t *testing.T, seats int64) {
	t.Helper()
	hosttest.Eventually(t, 30*time.Second, "the jobs applied", func() bool {
		return b.count(t, `SELECT seats_sold FROM events WHERE id = $1`, b.event) == seats &&
			b.count(t, `SELECT count(*) FROM outbox WHERE outcome IS DISTINCT FROM 'applied'`) == 0
	})
	require.Zero(t, b.count(t, `SELECT count(*) FROM dead_letters`))
}

var traceparent = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)

// Committed with the order: relayed and run by the host, once; the job id
// the handler recorded is the outbox id Enqueue returned. Rolled back:
// nothing.
func TestEnqueueInApplicationTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()

	id1, err := placeOrder(ctx, b.pool, b.event, 2)
	require.NoError(t, err)
	id2, err := placeOrderSQL(ctx, db, b.event, 3)
	require.NoError(t, err)
	b.waitSeats(t, 5)
	for _, id := range []int64{id1, id2} {
		require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM processed_jobs WHERE job_id = $1 AND kind = 'update_sales_counter'`, strconv.FormatInt(id, 10)))
	}
	var req, trace string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT request_id, trace FROM outbox WHERE id = $1`, id1).Scan(&req, &trace))
	require.Equal(t, "req-go-pgx", req)
	require.Regexp(t, traceparent, trace, "a new traceparent when none is given")

	// Rolled back, with pgx and with database/sql: no row, no run.
	oops := errors.New("the order failed")
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := client.Enqueue(ctx, tx, client.Job{Kind: "update_sales_counter", Payload: map[string]any{"order_id": 1}}); err != nil {
			return err
		}
		return oops
	})
	require.ErrorIs(t, err, oops)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = client.EnqueueSQL(ctx, tx, client.Job{Kind: "update_sales_counter", Payload: json.RawMessage(`{"order_id": 1}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.EqualValues(t, 2, b.count(t, `SELECT count(*) FROM outbox`), "no row, so nothing to relay")
	require.EqualValues(t, 5, b.count(t, `SELECT seats_sold FROM events WHERE id = $1`, b.event))
	require.EqualValues(t, 2, b.count(t, `SELECT count(*) FROM processed_jobs`))
}

// appRole is the database's URL for an application's role, usher_test_app,
// which holds nothing but the README's grant.
func appRole(t *testing.T, b *testBundle) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, hosttest.AdminURL(t, b.dbURL))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'usher_test_app') THEN CREATE ROLE usher_test_app LOGIN; END IF;
	EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; -- created by a test running at once
	END $$`)
	require.NoError(t, err)
	grant := doctest.Block(t, "docs/plugins.md", "**Who may call it.**", "sql")
	require.Equal(t, []string{"GRANT EXECUTE ON FUNCTION usher_enqueue_job(text, jsonb, text, text) TO app;"}, grant)
	// As the runtime's owner, who owns the function.
	_, err = b.pool.Exec(ctx, strings.Replace(grant[0], " TO app;", " TO usher_test_app", 1))
	require.NoError(t, err)
	u, err := url.Parse(b.dbURL)
	require.NoError(t, err)
	u.User = url.User("usher_test_app")
	return u.String()
}

// The README's psql and Python examples, run as written by the
// application's role, each in its transaction: their jobs run.
func TestEnqueueFromPsqlAndPython(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	appURL := appRole(t, b)
	order := func(seats int) string {
		p, err := orders.Place(ctx, b.pool, orders.Order{EventID: b.event, Buyer: "B", Email: "b@example.com", Seats: seats}, orders.Jobs{})
		require.NoError(t, err)
		return strconv.FormatInt(p.ID, 10)
	}
	env := func(orderID string) []string {
		return append(os.Environ(), "APP_DATABASE_URL="+appURL, "ORDER_ID="+orderID)
	}

	psql := exec.Command("sh", "-c", strings.Join(doctest.Block(t, "docs/plugins.md", "**psql**", "sh"), "\n")+"\n")
	psql.Env = env(order(2))
	out, err := psql.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "COMMIT")

	py, ok := python()
	if !ok {
		if os.Getenv("CI") != "" {
			t.Fatal("no python3 imports psycopg2 and CI is set: .ci/tools installs Debian's python3-psycopg2")
		}
		b.waitSeats(t, 2)
		require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE request_id = 'req-psql'`))
		t.Skip("psql's enqueue ran; Python's skips: no python3 imports psycopg2 (apt-get install python3-psycopg2, as make test's tools step does where it can)")
	}
	dir := t.TempDir()
	script := strings.Join(doctest.Block(t, "docs/plugins.md", "**Python, psycopg2**", "python"), "\n") + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "enqueue.py"), []byte(script), 0o644))
	pyCmd := exec.Command(py, "enqueue.py")
	pyCmd.Dir, pyCmd.Env = dir, env(order(3))
	out, err = pyCmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	pyJob, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	require.NoError(t, err, "it prints the job's outbox id: %s", out)

	b.waitSeats(t, 5)
	require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE request_id = 'req-psql'`))
	require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE id = $1 AND request_id = 'req-python'`, pyJob))
	var trace string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT trace FROM outbox WHERE id = $1`, pyJob).Scan(&trace))
	require.Regexp(t, traceparent, trace, "usher_enqueue_job makes a traceparent as the client does")
}

// python is a python3 that imports psycopg2: the one on PATH, else
// Debian's (.ci/tools installs python3-psycopg2 there; a python3 of
// pyenv's or a virtualenv's does not see it). ok is false when neither does.
func python() (path string, ok bool) {
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import psycopg2").Run() == nil {
			return p, true
		}
	}
	return "", false
}

// Only the roles an operator grants it to may call usher_enqueue_job:
// PUBLIC may not, a plugin's role may not, and a host refuses a plugin
// whose role could. Oversized or kindless jobs are refused by the client
// before the round trip, and by the function, with the limit named.
func TestEnqueueJobRefuses(t *testing.T) {
	t.Parallel()
	pool, dbURL := hosttest.DB(t)
	ctx := context.Background()
	require.EqualValues(t, 0, hosttest.Count(t, pool, `
		SELECT count(*) FROM pg_proc p LEFT JOIN LATERAL aclexplode(p.proacl) a ON true
		WHERE p.proname = 'usher_enqueue_job' AND (p.proacl IS NULL OR a.grantee = 0)`), "PUBLIC has no EXECUTE")

	role := sandbox.PluginRole("counters")
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	plugin, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	defer plugin.Close(ctx)
	_, err = plugin.Exec(ctx, `SELECT usher_enqueue_job('update_sales_counter', '{"order_id": 1}')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "insufficient_privilege")
	require.Contains(t, pgErr.Message, "permission denied for function usher_enqueue_job")

	_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION `+sandbox.AppEnqueueFunction+` TO `+role)
	require.NoError(t, err)
	err = sandbox.CheckPluginRole(ctx, pool, "counters", role)
	require.ErrorContains(t, err, "it may call usher_enqueue_job(text, jsonb, text, text), the applications' enqueue")

	// The limits are the host's entry limit's.
	require.Equal(t, 1<<20, entry.MaxBytes)
	require.Equal(t, 1032192, client.MaxPayloadBytes, "the number usher_enqueue_job and the README state")
	big := `{"pad": "` + strings.Repeat("a", client.MaxPayloadBytes) + `"}`
	_, err = client.Enqueue(ctx, pool, client.Job{Kind: "k", Payload: json.RawMessage(big)})
	require.ErrorContains(t, err, "payload of 1032203 bytes is over the 1032192-byte limit")
	_, err = client.Enqueue(ctx, pool, client.Job{Payload: 1})
	require.ErrorContains(t, err, "the job has no kind")
	_, err = pool.Exec(ctx, `SELECT usher_enqueue_job('k', $1::jsonb)`, big)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "54000", pgErr.Code, "program_limit_exceeded")
	require.Contains(t, pgErr.Message, "k payload of 1032203 bytes is over the 1032192-byte limit")
	_, err = pool.Exec(ctx, `SELECT usher_enqueue_job('', '{}')`)
	require.ErrorContains(t, err, "the job has no kind")
	_, err = pool.Exec(ctx, `SELECT usher_enqueue_job('k', NULL)`)
	require.ErrorContains(t, err, "k job has no payload")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`))
}

// The README's Go examples are readme_test.go's functions, character for
// character, so what the tests run is what the README shows.
func TestREADMEGoExamples(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("readme_test.go")
	require.NoError(t, err)
	f, err := parser.ParseFile(token.NewFileSet(), "readme_test.go", src, parser.ParseComments)
	require.NoError(t, err)
	section, _, _ := strings.Cut(readmeSection(t), "**psql**")
	var n int
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		text := string(src[fn.Doc.Pos()-1 : fn.End()-1])
		require.Contains(t, section, "```go\n"+text+"\n```", "README's example %s", fn.Name.Name)
		n++
	}
	require.Equal(t, 2, n)
}

func readmeSection(t *testing.T) string {
	t.Helper()
	return doctest.After(t, "docs/plugins.md", "## Enqueue from your application")
}

// An application importing the client brings in neither the host nor
// Redis.
func TestClientDependsOnNeitherHostNorRedis(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/usherhq/usher/client").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		require.False(t, strings.Contains(dep, "redis") || strings.HasPrefix(dep, "github.com/usherhq/usher/host"),
			"the client depends on %s", dep)
	}
}

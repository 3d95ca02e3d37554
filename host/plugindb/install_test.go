package plugindb_test

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
)

// refunds is a third party's plugin: a table of its own, and grants on
// the application's wallets.
const refunds = "refunds"

const refundsSQL = `-- +goose Up
CREATE TABLE refunds (
    id        bigserial PRIMARY KEY,
    wallet_id bigint    NOT NULL,
    amount    integer   NOT NULL
);

-- +goose StatementBegin
CREATE FUNCTION refund_total(w bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(sum(amount), 0) FROM refunds WHERE wallet_id = w;
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE refunds;
`

type testBundle struct {
	pool *pgxpool.Pool
	ctx  context.Context
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	hosttest.EnsureRoles(t, refunds)
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	// The application's table, owned by the host's login (as Stagedoor's
	// are): the plugin is granted columns of it.
	_, err := pool.Exec(ctx, `CREATE TABLE wallets (id bigserial PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, owner_note text);
		INSERT INTO wallets (balance, owner_note) VALUES (100, 'secret')`)
	require.NoError(t, err)
	return &testBundle{pool: pool, ctx: ctx}
}

func spec(t *testing.T, files fstest.MapFS, grants ...pluginhost.Grant) plugindb.Spec {
	t.Helper()
	s := plugindb.Spec{Name: refunds, Version: "1.0.0", Grants: grants}
	if files != nil {
		sum, err := pluginhost.MigrationsSHA256(files)
		require.NoError(t, err)
		s.Migrations, s.MigrationsSHA256 = files, sum
	}
	return s
}

var walletGrant = pluginhost.Grant{Table: "wallets", Select: []string{"id", "balance"}, Update: []string{"balance"}}

func (b *testBundle) privilege(t *testing.T, sql string, args ...any) bool {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&ok))
	return ok
}

func (b *testBundle) pluginPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := sandbox.OpenPluginPool(b.ctx, sandbox.PoolConfig{Base: b.pool.Config(), Role: sandbox.PluginRole(refunds), Size: 1, Plugin: refunds})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func TestInstallAppliesMigrationsAndExactGrants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := sandbox.PluginRole(refunds)
	res, err := plugindb.Install(b.ctx, b.pool, spec(t, fstest.MapFS{"00001_refunds.sql": {Data: []byte(refundsSQL)}}, walletGrant))
	require.NoError(t, err)
	require.False(t, res.Unchanged)
	require.Equal(t, []string{"00001_refunds.sql"}, res.Applied)

	// Its schema's tables: rows, never DDL, TRUNCATE or the version table.
	require.True(t, b.privilege(t, `SELECT has_table_privilege($1, 'plugin_refunds.refunds', 'SELECT,INSERT,UPDATE,DELETE')`, role))
	require.False(t, b.privilege(t, `SELECT has_table_privilege($1, 'plugin_refunds.refunds', 'TRUNCATE')`, role))
	require.False(t, b.privilege(t, `SELECT has_table_privilege($1, 'plugin_refunds.goose_db_version', 'SELECT')`, role))
	require.False(t, b.privilege(t, `SELECT has_schema_privilege($1, 'plugin_refunds', 'CREATE')`, role))
	require.True(t, b.privilege(t, `SELECT has_schema_privilege($1, 'plugin_refunds', 'USAGE')`, role))
	require.False(t, b.privilege(t, `SELECT pg_has_role($1, 'usher_schema_refunds', 'MEMBER')`, role))
	var owner string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT tableowner FROM pg_tables WHERE schemaname = 'plugin_refunds' AND tablename = 'refunds'`).Scan(&owner))
	require.Equal(t, "usher_schema_refunds", owner)

	// The application's table: exactly the declared columns.
	require.True(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'balance', 'UPDATE')`, role))
	require.False(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'id', 'UPDATE')`, role))
	require.False(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'owner_note', 'SELECT')`, role))
	require.False(t, b.privilege(t, `SELECT has_table_privilege($1, 'wallets', 'SELECT')`, role), "column grants, not the table")
	rows, err := b.pool.Query(b.ctx, `SELECT column_name || ':' || privilege_type FROM information_schema.column_privileges
		WHERE grantee = $1 AND table_name = 'wallets' ORDER BY 1`, role)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"balance:SELECT", "balance:UPDATE", "id:SELECT"}, got)

	// As the plugin: its own table unqualified, the declared columns, and
	// nothing else.
	pp := b.pluginPool(t)
	_, err = pp.Exec(b.ctx, `INSERT INTO refunds (wallet_id, amount) VALUES (1, 5)`)
	require.NoError(t, err)
	var total int64
	require.NoError(t, pp.QueryRow(b.ctx, `SELECT refund_total(1)`).Scan(&total))
	require.Equal(t, int64(5), total)
	_, err = pp.Exec(b.ctx, `UPDATE wallets SET balance = balance - 5 WHERE id = 1`)
	require.NoError(t, err)
	_, err = pp.Exec(b.ctx, `SELECT owner_note FROM wallets`)
	require.ErrorContains(t, err, "permission denied")
	_, err = pp.Exec(b.ctx, `TRUNCATE refunds`)
	require.ErrorContains(t, err, "permission denied")
	_, err = pp.Exec(b.ctx, `CREATE TABLE plugin_refunds.mine (id int)`)
	require.ErrorContains(t, err, "permission denied")
	_, err = pp.Exec(b.ctx, `SET ROLE usher_schema_refunds`)
	require.ErrorContains(t, err, "permission denied")

	// The same manifest again: nothing to do.
	res, err = plugindb.Install(b.ctx, b.pool, spec(t, fstest.MapFS{"00001_refunds.sql": {Data: []byte(refundsSQL)}}, walletGrant))
	require.NoError(t, err)
	require.True(t, res.Unchanged)
	require.Equal(t, int64(1), hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_installs WHERE name = 'refunds' AND grants @> '[{"table":"wallets"}]'`))

	// A new migration runs alone; the first is not applied twice.
	res, err = plugindb.Install(b.ctx, b.pool, spec(t, fstest.MapFS{
		"00001_refunds.sql": {Data: []byte(refundsSQL)},
		"00002_reason.sql":  {Data: []byte("-- +goose Up\nALTER TABLE refunds ADD COLUMN reason text;\n-- +goose Down\nALTER TABLE refunds DROP COLUMN reason;\n")},
	}, walletGrant))
	require.NoError(t, err)
	require.Equal(t, []string{"00002_reason.sql"}, res.Applied)
	require.Equal(t, int64(1), hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_refunds.refunds`))
}

func TestInstallRevokesGrantsNoLongerDeclared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := sandbox.PluginRole(refunds)
	_, err := plugindb.Install(b.ctx, b.pool, spec(t, nil, walletGrant))
	require.NoError(t, err)
	require.True(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'balance', 'UPDATE')`, role))

	res, err := plugindb.Install(b.ctx, b.pool, spec(t, nil, pluginhost.Grant{Table: "wallets", Select: []string{"id"}}))
	require.NoError(t, err)
	require.False(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'balance', 'UPDATE')`, role))
	require.False(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'balance', 'SELECT')`, role))
	require.True(t, b.privilege(t, `SELECT has_column_privilege($1, 'wallets', 'id', 'SELECT')`, role))
	require.Empty(t, res.Revoked)

	res, err = plugindb.Install(b.ctx, b.pool, spec(t, nil))
	require.NoError(t, err)
	require.Equal(t, []string{"wallets"}, res.Revoked)
	require.False(t, b.privilege(t, `SELECT has_any_column_privilege($1, 'wallets', 'SELECT,INSERT,UPDATE,REFERENCES')`, role))
}

func TestInstallRefusesGrants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for table, want := range map[string]string{
		"outbox":                     "one of the runtime's tables",
		"plugin_tickets.email_sends": "in a plugin's schema",
		"nowhere":                    "does not exist",
	} {
		_, err := plugindb.Install(b.ctx, b.pool, spec(t, nil, pluginhost.Grant{Table: table, Select: []string{"order_id"}}))
		require.ErrorContains(t, err, want, table)
	}
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_installs WHERE name = 'refunds'`))
}

func TestInstallRefusesStaleChecksum(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec(t, fstest.MapFS{"00001_refunds.sql": {Data: []byte(refundsSQL)}})
	s.Migrations = fstest.MapFS{"00001_refunds.sql": {Data: []byte(refundsSQL + "\n-- changed\n")}}
	_, err := plugindb.Install(b.ctx, b.pool, s)
	require.ErrorContains(t, err, "not the manifest's migrations_sha256")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM pg_namespace WHERE nspname = 'plugin_refunds'`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_installs WHERE name = 'refunds'`))
}

// TestHostileMigrationsLeaveNothing: each migration is refused, by its
// words or by what the database reports, and the install's transaction
// takes everything it did with it.
func TestHostileMigrationsLeaveNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fingerprint := func() string {
		var s string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT concat_ws('/',
			(SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname IN ('public', 'plugin_refunds')),
			(SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname IN ('public', 'plugin_refunds')),
			(SELECT count(*) FROM pg_namespace),
			(SELECT count(*) FROM plugin_installs),
			(SELECT rolsuper::text FROM pg_roles WHERE rolname = 'usher_plugin_refunds'),
			(SELECT count(*) FROM wallets),
			(SELECT coalesce(string_agg(c.relname || coalesce(c.relacl::text, ''), ',' ORDER BY c.relname), '') FROM pg_class c
				JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'))`).Scan(&s))
		return s
	}
	before := fingerprint()
	const table = "CREATE TABLE refunds (id int);\n"
	for _, c := range []struct{ name, sql, want string }{
		{"create in public", "CREATE TABLE public.evil (id int);", "permission denied for schema public"},
		{"grant to others", table + "GRANT SELECT ON refunds TO PUBLIC;", "GRANT"},
		{"dynamic grant", table + "DO $$ BEGIN EXECUTE 'GR' || 'ANT SELECT ON refunds TO usher_test_owner'; END $$;", "DO: a migration may not run anonymous code blocks"},
		{"alter role", "ALTER ROLE usher_plugin_refunds SUPERUSER;", "roles are an administrator's"},
		{"set role back", "SET ROLE usher_test_owner;", "SET ROLE"},
		{"set local role", "SET LOCAL ROLE NONE;", "SET ROLE"},
		{"reset role", table + "RESET ROLE;\nCREATE TABLE public.evil (id int);", "RESET ROLE"},
		{"session authorization", "SET SESSION AUTHORIZATION DEFAULT;", "SESSION AUTHORIZATION"},
		{"set_config", "SELECT set_config('role', 'none', true);", "set_config"},
		{"dynamic reset", "DO $$ BEGIN EXECUTE 'RES' || 'ET ROLE'; END $$;", "DO: a migration"},
		{"reset hidden by a block comment", "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS 'RESET/**/ROLE; SET/**/ROLE usher_schema_refunds';\nSELECT f();", "a block comment"},
		{"reset split by a line comment", "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS 'RESET -- x\nROLE; SET ROLE usher_schema_refunds';\nSELECT f();", "RESET ROLE"},
		{"reset behind a comment that ends a string", "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS 'SELECT ''\n--''; RESET ROLE; SET ROLE usher_schema_refunds; SELECT ''';\nSELECT f();", "RESET ROLE"},
		{"dynamic reset in a function", "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$ BEGIN EXECUTE 'RES' || 'ET ROLE'; END $$;\nSELECT f();", "EXECUTE: a migration"},
		{"dynamic read of a secret", "CREATE TABLE loot AS SELECT * FROM query_to_xml('SELECT * FROM public.runtime_secrets', true, false, '');", "runs a query given as text"},
		{"dynamic reset and back", "DO $$ BEGIN EXECUTE 'RES' || 'ET ROLE'; EXECUTE 'DROP TABLE public.wallets'; EXECUTE 'SE' || 'T ROLE usher_schema_refunds'; END $$;",
			"DO: a migration"},
		{"dynamic write and back", "DO $$ BEGIN EXECUTE 'RES' || 'ET ROLE'; EXECUTE 'UPDATE public.wallets SET owner_note = NULL'; EXECUTE 'SE' || 'T ROLE usher_schema_refunds'; END $$;",
			"DO: a migration"},
		{"dynamic alter and back", "DO $$ BEGIN EXECUTE 'RES' || 'ET ROLE'; EXECUTE 'ALTER TABLE public.wallets ADD COLUMN x int'; EXECUTE 'SE' || 'T ROLE usher_schema_refunds'; END $$;",
			"DO: a migration"},
		{"security definer", "CREATE FUNCTION f() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1';", "SECURITY DEFINER"},
		{"dynamic security definer", "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';\nDO $$ BEGIN EXECUTE 'ALTER FUNCTION f() SECURITY ' || 'DEFINER'; END $$;",
			"DO: a migration"},
		{"runtime table", "DELETE FROM public.outbox;", "permission denied for table outbox"},
		{"runtime function", "SELECT public.usher_gate_check();", "permission denied for function usher_gate_check"},
		{"create schema", "CREATE SCHEMA evil;", "schemas are an administrator's"},
		{"no transaction", "-- +goose NO TRANSACTION\nCREATE TABLE refunds (id int);", "NO TRANSACTION"},
	} {
		files := fstest.MapFS{"00001_hostile.sql": {Data: []byte("-- +goose Up\n" + c.sql + "\n")}}
		_, err := plugindb.Install(b.ctx, b.pool, spec(t, files, walletGrant))
		require.ErrorContains(t, err, c.want, c.name)
		require.Equal(t, before, fingerprint(), "%s left something behind", c.name)
	}
	// After all that, the plugin's own migration installs.
	_, err := plugindb.Install(b.ctx, b.pool, spec(t, fstest.MapFS{"00001_refunds.sql": {Data: []byte(refundsSQL)}}, walletGrant))
	require.NoError(t, err)
}

// Hosts that start at once install the same plugin at once: they take
// turns, and each finds what the one before it installed (the chaos
// suite's three hosts found a lookup taken before the lock: the later
// installs ran the migrations again, "relation already exists").
func TestConcurrentInstallsTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec(t, fstest.MapFS{"00001_refunds.sql": {Data: []byte(refundsSQL)}}, walletGrant)
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			_, err := plugindb.Install(b.ctx, b.pool, s)
			errs <- err
		}()
	}
	for range cap(errs) {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_refunds.goose_db_version WHERE version_id = 1`))
}

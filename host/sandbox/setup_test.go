package sandbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
)

// setupCluster gives a test databases of its own on the tests' cluster,
// as its administrator, and drops them and the roles named by drop when
// the test ends.
type setupCluster struct {
	t     *testing.T
	admin *pgx.Conn
	roles []string
}

func newSetupCluster(t *testing.T) *setupCluster {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, hosttest.DatabaseURL())
	require.NoError(t, err)
	c := &setupCluster{t: t, admin: admin}
	t.Cleanup(func() {
		for _, r := range c.roles {
			_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
		}
		_ = admin.Close(context.Background())
	})
	return c
}

// database creates a database and returns a connection to it as the
// administrator.
func (c *setupCluster) database() (*pgx.Conn, string) {
	ctx := context.Background()
	name := hosttest.DatabasePrefix + hosttest.Suffix()
	_, err := c.admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(c.t, err)
	cfg, err := pgx.ParseConfig(hosttest.DatabaseURL())
	require.NoError(c.t, err)
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(c.t, err)
	// Runs before the roles are dropped (cleanups run last first).
	c.t.Cleanup(func() {
		_ = conn.Close(context.Background())
		_, _ = c.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return conn, name
}

func (c *setupCluster) drop(deployment string, plugins ...string) {
	c.roles = append(c.roles, sandbox.OwnerIn(deployment))
	for _, p := range plugins {
		c.roles = append(c.roles, sandbox.PluginRoleIn(deployment, p), sandbox.SchemaRoleIn(deployment, p))
	}
}

// Two deployments on one cluster never share a role: each has its own
// names, marked as its own and recorded on its database, and setup
// refuses to take over roles another deployment owns, or unmarked ones
// another database uses. Before, both databases' setups made and reset
// the same usher_plugin_<name>.
func TestSetupDeployments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newSetupCluster(t)
	prod, staging := "p"+hosttest.Suffix(), "s"+hosttest.Suffix()
	c.drop(prod, "counters")
	c.drop(staging, "counters")
	prodDB, prodName := c.database()
	stagingDB, _ := c.database()

	require.NoError(t, sandbox.Setup(ctx, prodDB, sandbox.SetupConfig{Deployment: prod, Plugins: []string{"counters"},
		OwnerPassword: "owner-pw", PluginPasswords: map[string]string{"counters": "prod-pw"}, PluginConnectionLimit: 12}))
	require.NoError(t, sandbox.Setup(ctx, stagingDB, sandbox.SetupConfig{Deployment: staging, Plugins: []string{"counters"}}))
	// Again: a setup is safe to repeat.
	require.NoError(t, sandbox.Setup(ctx, prodDB, sandbox.SetupConfig{Deployment: prod, Plugins: []string{"counters"}, PluginConnectionLimit: 12}))

	prodRole, stagingRole := sandbox.PluginRoleIn(prod, "counters"), sandbox.PluginRoleIn(staging, "counters")
	require.Equal(t, "usher_"+prod+"_plugin_counters", prodRole)
	require.NotEqual(t, prodRole, stagingRole)
	require.Equal(t, "usher_plugin_counters", sandbox.PluginRoleIn("", "counters"), "the default deployment keeps its names")
	var limit int
	var mark string
	require.NoError(t, c.admin.QueryRow(ctx, `SELECT rolconnlimit, shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1`, prodRole).Scan(&limit, &mark))
	require.Equal(t, 12, limit, "the plugin role's CONNECTION LIMIT")
	require.Equal(t, "usher deployment "+prod+" on database "+prodName, mark)
	// Each database knows its deployment: its hosts find their roles by it.
	for db, want := range map[*pgx.Conn]string{prodDB: prod, stagingDB: staging} {
		// The setting applies to sessions that start after it.
		cfg := db.Config().Copy()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		role, err := sandbox.PluginRoleOf(ctx, conn, "counters")
		require.NoError(t, err)
		require.Equal(t, sandbox.PluginRoleIn(want, "counters"), role)
		require.NoError(t, conn.Close(ctx))
	}

	// Staging's setup naming production's deployment, on its own
	// database: refused before it changes anything (production's password
	// is kept).
	err := sandbox.Setup(ctx, stagingDB, sandbox.SetupConfig{Deployment: prod, Plugins: []string{"counters"},
		PluginPasswords: map[string]string{"counters": "stolen"}})
	require.ErrorContains(t, err, "role usher_"+prod+" belongs to deployment "+prod+" on database "+prodName)
	// A database recorded as one deployment's is not set up as another's.
	other := "o" + hosttest.Suffix()
	c.drop(other, "counters")
	err = sandbox.Setup(ctx, prodDB, sandbox.SetupConfig{Deployment: other, Plugins: []string{"counters"}})
	require.ErrorContains(t, err, "database "+prodName+" belongs to usher deployment "+prod)
	require.Zero(t, count(t, c.admin, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, sandbox.OwnerIn(other)), "refused, yet a role was made")

	// A role with no mark (made before deployments were named) that
	// another database uses is refused, unless adopted.
	legacy := "l" + hosttest.Suffix()
	c.drop(legacy, "counters")
	_, err = c.admin.Exec(ctx, "CREATE ROLE "+sandbox.PluginRoleIn(legacy, "counters")+" LOGIN")
	require.NoError(t, err)
	_, err = prodDB.Exec(ctx, "CREATE TABLE legacy_rows (n int); GRANT SELECT ON legacy_rows TO "+sandbox.PluginRoleIn(legacy, "counters"))
	require.NoError(t, err)
	otherDB, _ := c.database()
	err = sandbox.Setup(ctx, otherDB, sandbox.SetupConfig{Deployment: legacy, Plugins: []string{"counters"}})
	require.ErrorContains(t, err, "carries no deployment's mark, and database "+prodName+" uses it")
	require.NoError(t, sandbox.Setup(ctx, otherDB, sandbox.SetupConfig{Deployment: legacy, Plugins: []string{"counters"}, Adopt: true}))
	_, err = prodDB.Exec(ctx, "DROP TABLE legacy_rows")
	require.NoError(t, err)

	require.Error(t, sandbox.CheckDeployment("Prod"))
	require.Error(t, sandbox.CheckDeployment("plugin"))
	require.Error(t, sandbox.CheckDeployment("a_b"))
	require.NoError(t, sandbox.CheckDeployment(""))
}

func count(t *testing.T, conn *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, conn.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

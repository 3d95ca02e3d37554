package sdktest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/sdk/sdktest"
)

// The kit's roles and databases take the names it is given
// (USHER_TEST_DEPLOYMENT, USHER_TEST_DATABASE_PREFIX), so a kit run on a
// shared cluster touches no role of anyone else's: here a deployment of
// the test's own, run in a child process (the names are read at start),
// whose roles are dropped after. Before, the kit made usher_test_owner
// and usher_plugin_<name> on whatever cluster it was given.
func TestKitNamesAreConfigurable(t *testing.T) {
	if dep := os.Getenv("USHER_TEST_DEPLOYMENT"); dep != "" {
		kitInDeployment(t, dep)
		return
	}
	t.Parallel()
	dep, prefix := "k"+hosttest.Suffix(), "usher_k"+hosttest.Suffix()+"_"
	admin, err := pgx.Connect(context.Background(), hosttest.DatabaseURL())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		// Every role of the deployment (the kit makes all its plugins'),
		// the owner last: it owns nothing left once the kit's databases
		// are dropped.
		rows, err := admin.Query(ctx, `SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1) ORDER BY rolname = $2, rolname`,
			"usher_"+dep+"_", "usher_"+dep+"_test_owner")
		if err == nil {
			roles, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			for _, r := range roles {
				_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+r)
			}
		}
		_ = admin.Close(ctx)
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestKitNamesAreConfigurable$", "-test.count=1")
	cmd.Env = append(os.Environ(), "USHER_TEST_DEPLOYMENT="+dep, "USHER_TEST_DATABASE_PREFIX="+prefix)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "PASS")
	require.Zero(t, count(t, admin, `SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)`, prefix), "the kit's databases are dropped")
}

func kitInDeployment(t *testing.T, dep string) {
	require.Equal(t, "usher_"+dep+"_test_owner", hosttest.Owner)
	var dbs []string
	c := bonusCase(t, rightBonus{})
	start := c.Start
	c.Start = func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Bonus] {
		var db, user string
		require.NoError(tb, pool.QueryRow(context.Background(), `SELECT current_database(), current_user`).Scan(&db, &user))
		require.Equal(tb, hosttest.Owner, user)
		dbs = append(dbs, db)
		return start(tb, pool)
	}
	sdktest.Run(t, c)
	require.NotEmpty(t, dbs)
	for _, db := range dbs {
		require.True(t, strings.HasPrefix(db, hosttest.DatabasePrefix), db)
	}
	admin, err := pgx.Connect(context.Background(), hosttest.DatabaseURL())
	require.NoError(t, err)
	defer admin.Close(context.Background())
	require.EqualValues(t, 1, count(t, admin, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, sandbox.PluginRoleIn(dep, "bonus")))
	require.Zero(t, count(t, admin, `SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())`),
		"the database the kit logs in to is left unrecorded")
}

func count(t *testing.T, conn *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, conn.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

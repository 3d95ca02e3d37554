package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pluginhost"
)

// hostileCase is one attack of host/testdata/hostileplugin and how it must
// end: dead-lettered with a reason containing dead, or applied (dead "").
type hostileCase struct {
	kind, name, dead string
	// absorbed: the run ends absorbed (its conditional write lost), with
	// no effect and no dead letter.
	absorbed bool
}

var hostileCases = []hostileCase{
	// Privilege: the session user is the plugin's own login role.
	{"hostile_apply", "reset-role", "permission denied for table outbox", false},
	{"hostile_apply", "set-role-owner", "permission denied to set role", false},
	{"hostile_apply", "session-auth", "permission denied to set session authorization", false},
	{"hostile_apply", "set-config-role", "permission denied to set role", false},
	{"hostile_apply", "other-role", "permission denied to set role", false},
	{"hostile_apply", "copy-program", "pg_execute_server_program", false},
	{"hostile_apply", "read-outbox", "permission denied for table outbox", false},
	{"hostile_apply", "other-table", "permission denied for table events", false},
	{"hostile_apply", "record-other", "does not serve kind update_sales_counter", false},
	{"hostile_apply", "enqueue-other", "may not enqueue kind update_sales_counter", false},
	{"hostile_apply", "write-history", "permission denied for table job_history", false},
	{"hostile_apply", "history-other", "does not serve kind update_sales_counter", false},
	{"hostile_apply", "record-others", "does not serve kind update_sales_counter", false},
	{"hostile_apply", "record-mixed", "does not serve kind update_sales_counter", false},
	{"hostile_apply", "history-batch-other", "does not serve kind update_sales_counter", false},
	{"hostile_apply", "history-batch-row", "outbox row 1 is not a hostile_apply row of job 1", false},
	{"hostile_apply", "pin-kind", "permission denied for table plugin_kinds", false},
	{"hostile_apply", "alter-role", "must be superuser to alter superuser roles", false},
	{"hostile_apply", "create-table", "permission denied for schema public", false},
	{"hostile_apply", "swallow-error", "a statement failed and the plugin answered OK: division by zero", false},
	// A login of its own, role settings that stick, objects outside its
	// schema: refused by the command's tag, or at commit by what the
	// database counts the transaction wrote (a DO block, a function).
	{"hostile_apply", "alter-password", "may not run ALTER ROLE", false},
	{"hostile_apply", "alter-password-do", "changed a role, its password or settings", false},
	{"hostile_apply", "role-setting", "may not run ALTER ROLE", false},
	{"hostile_apply", "role-setting-do", "changed a role, its password or settings", false},
	{"hostile_apply", "large-object", "or a large object", false},
	{"hostile_apply", "grant", "may not run GRANT", false},
	// The transaction is the host's.
	{"hostile_apply", "commit", "ended the host's transaction", false},
	{"hostile_apply", "commit-chain", "ended the host's transaction", false},
	{"hostile_apply", "commit-one-call", "ended the host's transaction", false},
	{"hostile_apply", "returned-commit", "ended the host's transaction", false},
	{"hostile_apply", "returned-rollback", "controlled the host's transaction (ROLLBACK)", false},
	{"hostile_apply", "returned-abort", "controlled the host's transaction (ROLLBACK)", false},
	{"hostile_apply", "returned-rollback-commit", "controlled the host's transaction (ROLLBACK)", false},
	{"hostile_apply", "returned-savepoint", "controlled the host's transaction (SAVEPOINT)", false},
	{"hostile_apply", "returned-query", "only plain writes can be returned", false},
	{"hostile_apply", "holdable-cursor", "", false},
	{"hostile_apply", "savepoint", "controlled the host's transaction (SAVEPOINT)", false},
	// Pooled connections: what it leaves is reset before the next job.
	{"hostile_apply", "poison", "", false},
	// The writes the host prepares on a connection (sandbox/statements.go):
	// a plugin that takes over their names runs only SQL of its own, and
	// not past the reset.
	{"hostile_apply", "returned-args", "", false},
	{"hostile_apply", "hijack-write", "", false},
	{"hostile_apply", "returned-args", "", false},
	{"hostile_apply", "hijack-gate", "controlled the host's transaction (ROLLBACK)", false},
	{"hostile_apply", "returned-args", "", false},
	{"hostile_apply", "hijack-commit", `syntax error at or near "COMMIT"`, false},
	{"hostile_apply", "returned-args", "", false},
	// An answer over the gRPC message cap: dead-lettered at once, saying
	// why, not abandoned to be delivered again and again.
	{"hostile_apply", "huge-answer", "over the 16777216-byte message cap", false},
	// Capabilities, decided by what the database reports.
	{"hostile_state", "readonly-write", "a read-only phase wrote", false},
	{"hostile_state", "readonly-commit", "controlled the host's transaction (COMMIT)", false},
	{"hostile_state", "write-before-win", "wrote before its conditional write won", false},
	{"hostile_state", "fake-returning", `the database ran "SELECT 1"`, false},
	{"hostile_state", "returned-writes", "only an apply phase that succeeded may", false},
	{"hostile_state", "write-after-loss", "wrote although its conditional write lost", false},
	{"hostile_state", "holdable-cursor", "", true},
	{"hostile_state", "clean", "", false},
}

type hostileBundle struct {
	*testBundle
	bin string
}

func hostileSetup(t *testing.T) *hostileBundle {
	t.Helper()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `
		CREATE TABLE hostile_effects (job_id text NOT NULL, n int NOT NULL DEFAULT 0);
		GRANT SELECT, INSERT, UPDATE ON hostile_effects TO usher_plugin_hostile`)
	require.NoError(t, err)
	return &hostileBundle{testBundle: b, bin: hosttest.Build(t, "./host/testdata/hostileplugin")}
}

// enqueue adds one hostile job per case, each followed by a clean probe of
// the same kind, and returns the job ids of the cases and of the probes.
func (b *hostileBundle) enqueue(t *testing.T, cases []hostileCase) (ids, probes []string) {
	t.Helper()
	ctx := context.Background()
	var msgs []outbox.Message
	for _, c := range cases {
		msgs = append(msgs,
			outbox.Message{Kind: c.kind, Payload: json.RawMessage(fmt.Sprintf(`{"case": %q}`, c.name))},
			outbox.Message{Kind: "hostile_apply", Payload: json.RawMessage(`{"case": "clean"}`)})
	}
	var got []int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		got, err = outbox.Add(ctx, tx, msgs...)
		return err
	}))
	for i, id := range got {
		if i%2 == 0 {
			ids = append(ids, fmt.Sprint(id))
		} else {
			probes = append(probes, fmt.Sprint(id))
		}
	}
	return ids, probes
}

// A plugin written to do harm, against the raw contract, ignoring every
// refusal it is answered with: each attack is refused or contained by the
// database or the host, while the counters plugin's jobs keep flowing, the
// host stays healthy, the next job finds a clean connection, and nothing
// is lost or doubled.
func TestHostilePlugin(t *testing.T) {
	t.Parallel()

	t.Run("contained", func(t *testing.T) {
		t.Parallel()
		b := hostileSetup(t)
		want := b.placeOrders(t, 20, 2)
		ids, probes := b.enqueue(t, hostileCases)
		cfg := b.config()
		cfg.Plugins = append(cfg.Plugins, b.bin)
		// One connection per plugin: every hostile job reuses the
		// connection the one before it had.
		cfg.PluginPoolSize = 1
		cfg.MaxAttempts = 1
		h := hosttest.Start(t, cfg)
		require.Equal(t, "usher_plugin_hostile", pluginStatus(t, h, "hostile").DBRole)

		hosttest.Eventually(t, 90*time.Second, "every job finished", func() bool {
			return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NULL`) == 0 &&
				hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
		})
		ctx := context.Background()
		for i, c := range hostileCases {
			var reason string
			err := b.pool.QueryRow(ctx, `SELECT reason || ' | ' || last_error FROM dead_letters WHERE job_id = $1`, ids[i]).Scan(&reason)
			if c.dead == "" {
				require.ErrorIs(t, err, pgx.ErrNoRows, "%s: dead-lettered: %s", c.name, reason)
				effects := int64(1)
				if c.absorbed {
					effects = 0
				}
				q := `SELECT count(*) FROM hostile_effects WHERE job_id = $1`
				if c.name == "hijack-write" {
					// Its write ran as the host prepared it, or as it
					// prepared it itself: one of the two, once.
					q = `SELECT count(*) FROM hostile_effects WHERE job_id IN ($1, $1 || '-hijacked')`
				}
				require.EqualValues(t, effects, hosttest.Count(t, b.pool, q, ids[i]), "%s: its effect", c.name)
				continue
			}
			require.NoError(t, err, "%s: not dead-lettered", c.name)
			require.Contains(t, reason, c.dead, c.name)
			require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id IN ($1, $1 || '-hijacked')`, ids[i]), "%s: an effect landed", c.name)
		}
		for i, p := range probes {
			require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE job_id = $1`, p),
				"the clean job after %s was refused (a poisoned connection?)", hostileCases[i].name)
			require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = $1`, p),
				"the clean job after %s", hostileCases[i].name)
		}
		// Nothing it tried landed anywhere else: no job it enqueued from
		// SQL (at COMMIT through a holdable cursor, or kept by its own
		// COMMIT) reached the outbox.
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE enqueued_by = 'usher_plugin_hostile'`))
		b.requireCounters(t, want)
		require.EqualValues(t, 20, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs WHERE kind = 'update_sales_counter' AND job_id = '999999'`))
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = 'update_sales_counter' AND id > $1`, ids[len(ids)-1]))
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_kinds WHERE kind = 'stolen'`))
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM pg_roles WHERE rolname = 'usher_plugin_hostile' AND rolsuper`))
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE relname = 'processed_jobs_shadow'`))
		// What it tried on its role and outside its schema was rolled back.
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM pg_largeobject_metadata WHERE lomowner = 'usher_plugin_hostile'::regrole`))
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM pg_db_role_setting WHERE setrole = 'usher_plugin_hostile'::regrole`))
		_, err := os.Stat("/tmp/usher-hostile-was-here")
		require.True(t, os.IsNotExist(err), "COPY TO PROGRAM ran")
		for _, p := range h.Plugins() {
			require.True(t, p.Healthy, p.Name)
		}
	})

	// Fair share: a plugin that turns off its statement timeout and sleeps
	// holds only its own connections, until the job's deadline, which is
	// the host's: the counters flow meanwhile, the stalled job waits its
	// backoff, and shutdown keeps its grace period.
	t.Run("stall", func(t *testing.T) {
		t.Parallel()
		b := hostileSetup(t)
		stall := make([]hostileCase, 4)
		for i := range stall {
			stall[i] = hostileCase{kind: "hostile_apply", name: "stall"}
		}
		ids, _ := b.enqueue(t, stall)
		cfg := b.config()
		cfg.Plugins = append(cfg.Plugins, b.bin)
		cfg.PluginPoolSize = 4
		cfg.JobTimeout = 3 * time.Second
		cfg.ShutdownGrace = time.Second
		// Only an administrator sees what another role's sessions run.
		admin, err := pgxpool.New(context.Background(), hosttest.AdminURL(t, b.dbURL))
		require.NoError(t, err)
		defer admin.Close()
		asleep := func() bool {
			return hosttest.Count(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'usher_plugin_hostile' AND wait_event = 'PgSleep' AND datname = current_database()`) > 0
		}
		h := hosttest.Start(t, cfg)
		hosttest.Eventually(t, 30*time.Second, "hostile jobs asleep", asleep)
		want := b.placeOrders(t, 20, 2)
		hosttest.Eventually(t, 60*time.Second, "the counters applied while the hostile plugin stalls", func() bool {
			return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 20
		})
		b.requireCounters(t, want)
		hosttest.Eventually(t, 60*time.Second, "each stalled job cut at the host's deadline and scheduled after its backoff", func() bool {
			return hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM scheduled_jobs
				WHERE job_id = ANY($1) AND reason LIKE '%timed out after 3s%' AND run_at - created_at >= interval '900 milliseconds'`, ids) == 4
		})
		for _, p := range h.Plugins() {
			require.True(t, p.Healthy, p.Name)
		}
		// Shutdown while a job sleeps: the grace period is the host's.
		// (A generous bound, many times the grace, not a speed claim: the
		// bug was a shutdown that waited for the plugin's sleep.)
		hosttest.Eventually(t, 30*time.Second, "a hostile job asleep again", asleep)
		start := time.Now()
		require.NoError(t, h.Stop())
		require.Less(t, time.Since(start), 20*time.Second, "shutdown waited for the plugin's sleep")
	})

	// Kinds are pinned: a plugin that declares another plugin's kind, or a
	// kind its manifest does not list, is refused alone; the host starts
	// and serves the others.
	t.Run("kinds", func(t *testing.T) {
		t.Parallel()
		b := hostileSetup(t)
		want := b.placeOrders(t, 10, 2)
		cfg := b.config()
		cfg.Plugins = append(cfg.Plugins, b.bin)
		cfg.PluginEnv = append(cfg.PluginEnv, "HOSTILE_KINDS=hostile_apply,update_sales_counter")
		h := hosttest.Start(t, cfg)
		b.waitDrained(t, 10)
		b.requireCounters(t, want)
		require.Len(t, h.Plugins(), 1)
		require.Len(t, h.Refusals(), 1)
		require.Contains(t, h.Refusals()[0].Error, "update_sales_counter")
		require.NoError(t, h.Stop())

		// The pin outlives the host that made it: a host without the
		// counters plugin still refuses the hostile one its kind.
		cfg = b.config()
		cfg.Plugins = []string{b.bin}
		cfg.PluginEnv = append(cfg.PluginEnv, "HOSTILE_KINDS=update_sales_counter")
		h2, err := host.New(context.Background(), cfg)
		require.NoError(t, err)
		defer h2.Close()
		require.Empty(t, h2.Plugins())
		require.Len(t, h2.Refusals(), 1)
		require.Contains(t, h2.Refusals()[0].Error, "update_sales_counter (pinned to counters, role usher_plugin_counters)")

		// A kind its manifest does not list.
		d := newPluginDir(t)
		d.install(b.counters, "counters", "counters", "1.0.0")
		d.copy(b.bin, "hostile")
		m, err := pluginhost.NewFileManifest(filepath.Join(d.dir, "hostile"), "hostile", "6.6.6", []string{"hostile_apply"})
		require.NoError(t, err)
		d.writeManifest(m)
		cfg = b.dirConfig(d)
		h3, err := host.New(context.Background(), cfg)
		require.NoError(t, err)
		defer h3.Close()
		require.Len(t, h3.Plugins(), 1)
		require.Contains(t, fmt.Sprint(h3.Refusals()), "declares kinds its manifest does not list: hostile_state")
	})
}

// A plugin sees none of the host's configuration: not its database or
// Redis URL, its admin token or its passfile, whatever the host's own
// environment holds. Run as another OS user (PluginUser, when the host is
// root, as in CI), it cannot read the host's files either.
//
// Not parallel: the host's environment is the process's.
func TestPluginSeesNoSecrets(t *testing.T) {
	b := hostileSetup(t)
	secret := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(secret, []byte("secret-token"), 0o600))
	t.Setenv("USHER_ADMIN_TOKEN", "secret-token")
	t.Setenv("PGPASSFILE", secret)
	t.Setenv("DATABASE_URL", b.dbURL)
	ids, probes := b.enqueue(t, []hostileCase{{"hostile_apply", "secrets", "", false}})
	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, b.bin)
	cfg.PluginEnv = append(cfg.PluginEnv, "HOSTILE_SECRET_FILES="+secret)
	if os.Geteuid() == 0 {
		// The binary where the other user can run it.
		dir, err := os.MkdirTemp("", "usher-plugin-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		require.NoError(t, os.Chmod(dir, 0o755))
		bin, err := os.ReadFile(b.bin)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "hostile"), bin, 0o755))
		cfg.Plugins = []string{b.counters, filepath.Join(dir, "hostile")}
		cfg.PluginUser = "nobody"
	} else {
		t.Log("not root: the plugin runs as the host's user, so only the environment is checked")
		cfg.PluginEnv = cfg.PluginEnv[:len(cfg.PluginEnv)-1]
	}
	hosttest.Start(t, cfg)
	hosttest.Eventually(t, 60*time.Second, "both jobs finished", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, append(ids, probes...)) == 2 ||
			hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) > 0
	})
	var reason string
	err := b.pool.QueryRow(context.Background(), `SELECT reason FROM dead_letters LIMIT 1`).Scan(&reason)
	require.ErrorIs(t, err, pgx.ErrNoRows, "the plugin %s", reason)
}

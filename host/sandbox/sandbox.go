// Package sandbox is the database side of the plugin boundary: the
// database's own privileges are what keep an untrusted plugin inside its
// role, its transaction and its share of the host.
//
//   - The host logs in as the runtime's owner, a role that owns the
//     runtime's tables and is not a superuser (CheckHostLogin).
//
//   - Each plugin's statements run on a pool of its own (OpenPluginPool)
//     whose connections log in as the plugin's role, usher_plugin_<name>:
//     session_user is the plugin, so no RESET ROLE, SET ROLE or set_config
//     can raise it, and the pool's size is all it can ever hold.
//
//   - Before a plugin is served, CheckPluginRole proves its role is a plain
//     login role, a member of no other role, with no privilege on the
//     runtime's tables; Prepare pins its kinds and lets it call the
//     runtime's SECURITY DEFINER functions.
//
//   - Every connection is reset (ResetSession: DISCARD ALL but for its
//     plans and the writes the host prepared, statements.go) before it
//     goes back to its pool, and one that is still inside a transaction is
//     destroyed.
//
//   - Every session the host opens is bounded by the server too
//     (session.go): idle_in_transaction_session_timeout, TCP keepalives
//     and, for a plugin's, lock_timeout, so a frozen host frees its locks.
//
// Setup, run once by an administrator, creates the owner and the plugins'
// roles, each with a CONNECTION LIMIT, named and marked for their
// deployment (one per database on a shared cluster), and refuses roles
// another deployment owns. What the database lets any role do to itself
// (change its own password or settings, which would give a plugin a login
// of its own) is refused by the host's commit gate (migration 00037) and
// by the command tags guard refuses.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgpassfile"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RolePrefix prefixes a plugin's Postgres role: plugin "counters" runs as
// usher_plugin_counters.
const RolePrefix = "usher_plugin_"

// PluginRole is the login role plugin name's statements run as:
// usher_plugin_<name>, lower-cased, with every character other than a-z,
// 0-9 and _ replaced by _, cut to 63 bytes.
func PluginRole(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	s := RolePrefix + string(b)
	if len(s) > 63 {
		s = s[:63]
	}
	return s
}

// SchemaRole is the NOLOGIN role that owns plugin name's schema and runs
// its migrations: usher_schema_<name>. The runtime's owner is a member (to
// SET ROLE to it); the plugin's own login role never is.
func SchemaRole(name string) string { return cut63("usher_schema_" + name) }

// Schema is plugin name's own schema: plugin_<name>.
func Schema(name string) string { return cut63("plugin_" + name) }

func cut63(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// CheckPluginName refuses a plugin name that is not already the form its
// role takes (lower-case letters, digits and _, starting with a letter, at
// most 50 bytes): then no two names share a role, and no plugin can name
// itself into another's ("Tickets" into usher_plugin_tickets).
func CheckPluginName(name string) error {
	ok := len(name) > 0 && len(name) <= 63-len(RolePrefix) && name[0] >= 'a' && name[0] <= 'z'
	for _, c := range name {
		ok = ok && (c == '_' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9')
	}
	if !ok {
		return fmt.Errorf("plugin name %q is refused: a plugin's name is lower-case letters, digits and _, starts with a letter and has at most %d bytes (it names the Postgres role %s<name>)",
			name, 63-len(RolePrefix), RolePrefix)
	}
	return nil
}

// RuntimeTables are the runtime's own tables: no plugin role may hold any
// privilege on them.
var RuntimeTables = []string{"outbox", "processed_jobs", "scheduled_jobs", "dead_letters",
	"absorbed_duplicates", "plugin_kinds", "plugin_enqueues", "runtime_secrets", "tx_gates", "job_history", "plugin_installs",
	"workflows", "workflow_events", "workflow_steps", "workflow_timers", "workflow_signals", "workflow_decisions",
	"job_dedup_keys", "kind_pauses", "operator_actions", "workflow_binaries", "schedules", "kind_limits", "claim_wakes", "job_republishes", "job_cancels", "job_links"}

// AppEnqueueFunction is the applications' enqueue (package client, and any
// language's driver): an operator grants EXECUTE on it to an application's
// role, never to a plugin's.
const AppEnqueueFunction = "usher_enqueue_job(text, jsonb, text, text)"

// AppDedupEnqueueFunction is the applications' enqueue with a
// deduplication key (client.Job.DedupKey), granted as AppEnqueueFunction is.
const AppDedupEnqueueFunction = "usher_enqueue_job(text, jsonb, text, text, text, interval)"

// AppPriorityEnqueueFunction is the applications' enqueue with a priority
// (client.Job.Priority), granted as AppEnqueueFunction is.
const AppPriorityEnqueueFunction = "usher_enqueue_job(text, jsonb, text, text, text, interval, integer)"

// functions are the runtime's SECURITY DEFINER functions a plugin role may
// call (through the host, or by itself: each checks the caller).
var functions = []string{"usher_check_serves(text)", "usher_applied(bigint, text)", "usher_record_job(text, text)",
	"usher_gate_open(bytea)", "usher_gate_close(bytea)", "usher_gate_check()",
	"usher_enqueue(text, text, jsonb, text, text)", "usher_enqueue(text, text, jsonb, text, text, text)",
	"usher_applied_logged(bigint, text, text, integer, integer, text, text, text, text, text, text, timestamptz)",
	"usher_check_serves_all(text[])", "usher_record_jobs(text[], text[])",
	"usher_applied_batch(bigint[], text[], text[], integer[], integer[], text[], text[], text, text, text, text, timestamptz[])",
	"usher_statements_check(integer)", "usher_workflow_step_result(text, text, jsonb)"}

// CheckHostLogin refuses a host whose database login is a superuser, unless
// allowSuperuser: a superuser host means one escape from a plugin's role is
// the whole cluster. It returns the login's name and schema.
func CheckHostLogin(ctx context.Context, pool *pgxpool.Pool, allowSuperuser bool) (user, schema string, err error) {
	var super bool
	err = pool.QueryRow(ctx, `SELECT current_user::text, current_schema()::text, r.rolsuper
		FROM pg_roles r WHERE r.rolname = current_user`).Scan(&user, &schema, &super)
	if err != nil {
		return "", "", fmt.Errorf("sandbox: look up the host's login: %w", err)
	}
	if super && !allowSuperuser {
		return "", "", fmt.Errorf("the host's database login %s is a superuser: plugins run untrusted code, and a superuser host turns one escape into the whole cluster (COPY ... TO PROGRAM runs shell commands). "+
			"Log in as the runtime's owner role (create it with `host setup`; see docs/security.md, \"The plugin boundary: database roles\"), or pass --allow-superuser (host.Config.AllowSuperuser) to accept the risk", user)
	}
	return user, schema, nil
}

// CheckPluginRole proves role is fit to run a plugin's statements: it
// exists, may log in, is not the host's login, has no superuser,
// CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS attribute, is a member of
// no other role (so SET ROLE can take it nowhere), and holds no privilege on
// the runtime's tables.
func CheckPluginRole(ctx context.Context, pool *pgxpool.Pool, plugin, role string) error {
	var (
		login, super, createRole, createDB, repl, bypass bool
		memberOf                                         []string
		hostUser                                         string
	)
	err := pool.QueryRow(ctx, `
		SELECT r.rolcanlogin, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls,
		       coalesce(array(SELECT g.rolname::text FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
		                      WHERE m.member = r.oid ORDER BY 1), '{}'),
		       current_user::text
		FROM pg_roles r WHERE r.rolname = $1`, role).
		Scan(&login, &super, &createRole, &createDB, &repl, &bypass, &memberOf, &hostUser)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("plugin %s has no Postgres role %s: an administrator creates it once with `host setup --admin-url URL --plugin %s` (see docs/security.md, \"The plugin boundary: database roles\")", plugin, role, plugin)
	}
	if err != nil {
		return fmt.Errorf("look up role %s: %w", role, err)
	}
	var bad []string
	if role == hostUser {
		bad = append(bad, "it is the host's own login")
	}
	if !login {
		bad = append(bad, "it cannot log in (ALTER ROLE "+role+" LOGIN)")
	}
	for attr, has := range map[string]bool{"SUPERUSER": super, "CREATEROLE": createRole, "CREATEDB": createDB, "REPLICATION": repl, "BYPASSRLS": bypass} {
		if has {
			bad = append(bad, "it has "+attr)
		}
	}
	if len(memberOf) > 0 {
		bad = append(bad, "it is a member of "+strings.Join(memberOf, ", ")+" (a plugin's role must be a member of no other role: SET ROLE would take it there)")
	}
	var privileged []string
	err = pool.QueryRow(ctx, `
		SELECT coalesce(array(SELECT t FROM unnest($2::text[]) t
		       WHERE to_regclass(t) IS NOT NULL
		         AND (has_table_privilege($1, t, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')
		              OR has_any_column_privilege($1, t, 'SELECT,INSERT,UPDATE,REFERENCES'))), '{}')`,
		role, RuntimeTables).Scan(&privileged)
	if err != nil {
		return fmt.Errorf("check role %s's privileges: %w", role, err)
	}
	if len(privileged) > 0 {
		bad = append(bad, "it holds privileges on the runtime's tables "+strings.Join(privileged, ", "))
	}
	// The application's enqueue checks no kinds: a plugin enqueues only
	// through usher_enqueue, which allows the kinds of its manifest.
	for _, f := range []string{AppEnqueueFunction, AppDedupEnqueueFunction, AppPriorityEnqueueFunction} {
		var appEnqueue bool
		err = pool.QueryRow(ctx, `SELECT to_regprocedure($2) IS NOT NULL AND has_function_privilege($1, $2, 'EXECUTE')`,
			role, f).Scan(&appEnqueue)
		if err != nil {
			return fmt.Errorf("check role %s's privileges: %w", role, err)
		}
		if appEnqueue {
			bad = append(bad, "it may call "+f+", the applications' enqueue (REVOKE EXECUTE ON FUNCTION "+f+" FROM "+role+", and from PUBLIC)")
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("plugin %s's Postgres role %s is refused: %s", plugin, role, strings.Join(bad, "; "))
	}
	return nil
}

// Prepare pins kinds to the plugin's role (refusing a kind pinned to
// another role), records the other kinds it may enqueue, and lets the role
// call the runtime's functions. Several hosts may prepare the same plugin at
// once.
func Prepare(ctx context.Context, pool *pgxpool.Pool, plugin, role string, kinds, enqueues []string) error {
	if enqueues == nil {
		enqueues = []string{} // NULL would keep the kinds it may no longer enqueue
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// GRANTs of one object from two sessions at once fail with "tuple
		// concurrently updated": hosts prepare one at a time. A table lock
		// no plugin role can take (an advisory lock, any role could hold).
		if _, err := tx.Exec(ctx, `LOCK TABLE plugin_kinds IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			INSERT INTO plugin_kinds (kind, plugin, db_role)
			SELECT k, $2, $3 FROM unnest($1::text[]) k
			ON CONFLICT (kind) DO UPDATE SET plugin = excluded.plugin
			WHERE plugin_kinds.db_role = excluded.db_role
			RETURNING kind`, kinds, plugin, role)
		if err != nil {
			return fmt.Errorf("pin kinds: %w", err)
		}
		pinned, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("pin kinds: %w", err)
		}
		if len(pinned) != len(kinds) {
			var taken []string
			rows, err := tx.Query(ctx, `SELECT kind || ' (pinned to ' || plugin || ', role ' || db_role || ')'
				FROM plugin_kinds WHERE kind = ANY($1) AND db_role <> $2 ORDER BY kind`, kinds, role)
			if err == nil {
				taken, _ = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			return fmt.Errorf("plugin %s declares kinds another plugin serves: %s; a kind moves to another plugin only when an operator unpins it (DELETE FROM plugin_kinds WHERE kind = ...)",
				plugin, strings.Join(taken, ", "))
		}
		if _, err := tx.Exec(ctx, `DELETE FROM plugin_enqueues WHERE db_role = $1 AND kind <> ALL($2)`, role, enqueues); err != nil {
			return fmt.Errorf("record enqueues: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO plugin_enqueues (db_role, kind) SELECT $1, k FROM unnest($2::text[]) k ON CONFLICT DO NOTHING`, role, enqueues); err != nil {
			return fmt.Errorf("record enqueues: %w", err)
		}
		for _, f := range functions {
			if _, err := tx.Exec(ctx, fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s", f, pgx.Identifier{role}.Sanitize())); err != nil {
				return fmt.Errorf("grant %s to %s: %w", f, role, err)
			}
		}
		return nil
	})
}

// PoolConfig configures a plugin's pool.
type PoolConfig struct {
	// Base is the host's own pool configuration: the plugin's pool
	// connects to the same server and database. Required.
	Base *pgxpool.Config
	// Role is the plugin's login role. Required.
	Role string
	// Size is the most connections the plugin can hold. Default 4.
	Size int32
	// StatementTimeout is each connection's statement_timeout, given at
	// login so that RESET (and DISCARD ALL) come back to it. The host
	// also cancels every statement at the job's deadline, whatever a
	// plugin sets. Default 10s.
	StatementTimeout time.Duration
	// Password, when set, is the role's password. Default: the entry for
	// the role in the passfile (PGPASSFILE, else ~/.pgpass), as libpq
	// finds it; none with trust or certificate authentication.
	Password string
	// Schema is the schema of the application's tables (the runtime's,
	// where the host migrates), on the search_path after the plugin's own
	// schema (Schema(plugin)). Default "public".
	Schema string
	// Plugin is the plugin's name: its own schema, plugin_<name>, comes
	// first on the search_path, so its handlers name their tables
	// unqualified. Optional (then only Schema is on the path).
	Plugin string
	// LockTimeout is each connection's lock_timeout: a statement of the
	// plugin's that waits longer on a lock fails. Default
	// StatementTimeout (the host sets its own, host.Config.LockTimeout).
	LockTimeout time.Duration
	// IdleInTransactionTimeout is each connection's
	// idle_in_transaction_session_timeout: the server ends a session left
	// inside a transaction, sending nothing, for longer (its host frozen
	// or gone), and frees its locks. It must exceed the longest run of a
	// job (the host's JobTimeout). Default 60s.
	IdleInTransactionTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// OpenPluginPool opens the pool a plugin's statements run on: connections
// that log in as the plugin's role, at most Size of them. Every connection
// is reset with ResetSession before it goes back to the pool (a session
// setting, a temporary table, a prepared statement, a LISTEN or an advisory
// lock a plugin left does not outlive its call), and one still inside a
// transaction is destroyed.
func OpenPluginPool(ctx context.Context, c PoolConfig) (*pgxpool.Pool, error) {
	if c.Base == nil || c.Role == "" {
		return nil, errors.New("sandbox: a plugin pool needs Base and Role")
	}
	if c.Size <= 0 {
		c.Size = 4
	}
	if c.StatementTimeout <= 0 {
		c.StatementTimeout = 10 * time.Second
	}
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = c.StatementTimeout
	}
	if c.IdleInTransactionTimeout <= 0 {
		c.IdleInTransactionTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	cfg := c.Base.Copy()
	cc := cfg.ConnConfig
	cc.User = c.Role
	cc.Password = c.Password
	if cc.Password == "" {
		cc.Password = passfilePassword(cc.Host, cc.Port, cc.Database, c.Role)
	}
	// Descriptions only, no server-side prepared statements: the reset
	// deallocates those, and a plugin must not reach the host's.
	cc.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	// Given at login, these win over what the role set for itself with
	// ALTER ROLE ... SET (which RESET ALL does not undo), and are what
	// RESET comes back to.
	Bound(&cc.Config, SessionLimits{IdleInTransaction: c.IdleInTransactionTimeout, Lock: c.LockTimeout})
	cc.RuntimeParams["statement_timeout"] = fmt.Sprint(c.StatementTimeout.Milliseconds())
	schema := c.Schema
	if CheckPluginName(schema) != nil { // not a plain lower-case name: quoted
		schema = pgx.Identifier{schema}.Sanitize()
	}
	path := schema
	if c.Plugin != "" {
		// The plugin cannot create in its own schema (its owner is
		// usher_schema_<name>), so nothing of its making shadows anything.
		own := Schema(c.Plugin)
		if CheckPluginName(own) != nil {
			own = pgx.Identifier{own}.Sanitize()
		}
		path = own + ", " + schema
	}
	cc.RuntimeParams["search_path"] = path
	cc.RuntimeParams["default_transaction_read_only"] = "off"
	cc.RuntimeParams["default_transaction_isolation"] = "read committed"
	cfg.MaxConns, cfg.MinConns = c.Size, 0
	// None of the host pool's hooks: an embedding application's hooks were
	// written for its own login. (PrepareConn, when set, replaces the
	// deprecated BeforeAcquire.)
	cfg.BeforeConnect, cfg.AfterConnect = nil, nil
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) { return true, nil }
	logger := c.Logger
	cfg.BeforeClose = func(conn *pgx.Conn) {
		reset.Delete(conn)
		prepared.Delete(conn)
	}
	cfg.AfterRelease = func(conn *pgx.Conn) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, done := reset.LoadAndDelete(conn); !done {
			if err := resetSession(ctx, conn, c.Schema); err != nil {
				logger.Warn("reset of a plugin connection failed; it is closed", "role", c.Role, "err", err)
				return false
			}
		}
		if err := prepareNoted(ctx, conn); err != nil {
			logger.Warn("preparing a plugin's writes failed; the connection is closed", "role", c.Role, "err", err)
			return false
		}
		return true
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox: pool for %s: %w", c.Role, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if _, full := TooManyConnections(err); full {
			return nil, fmt.Errorf("sandbox: log in as %s: the server has no connection slot for it: the role's CONNECTION LIMIT (`host setup --plugin-connection-limit`) or the server's max_connections is spent; see docs/operating.md, \"Connection budget\": %w", c.Role, err)
		}
		return nil, fmt.Errorf("sandbox: log in as %s: %w (give the host the role's password in its passfile, PGPASSFILE; see docs/security.md, \"The plugin boundary: database roles\")", c.Role, err)
	}
	return pool, nil
}

// passfilePassword finds role's password the way libpq does: PGPASSFILE,
// else ~/.pgpass. A missing file or entry is no password.
func passfilePassword(host string, port uint16, database, role string) string {
	path := os.Getenv("PGPASSFILE")
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		path = filepath.Join(home, ".pgpass")
	}
	pf, err := pgpassfile.ReadPassfile(path)
	if err != nil {
		return ""
	}
	if strings.HasPrefix(host, "/") {
		host = "localhost"
	}
	return pf.FindPassword(host, fmt.Sprint(port), database, role)
}

// ResetSession is what a plugin's session is reset with before its
// connection is used again: DISCARD ALL's statements (PostgreSQL's manual
// lists them) but DISCARD PLANS and DEALLOCATE ALL, then StatementsCheck.
// A plugin's settings, role, cursors, prepared statements, LISTENs,
// advisory locks, temporary tables and sequence state do not outlive its
// call; the plans the server cached for the runtime's own functions do, so
// the next job's calls do not plan them again, and so do the writes the
// host prepared (see statements.go), which are the plugin's own SQL. A
// cached plan holds no privilege: the executor checks each statement's
// permissions every time it runs it.
var ResetSession = []string{"CLOSE ALL", "SET SESSION AUTHORIZATION DEFAULT", "RESET ALL",
	"UNLISTEN *", "SELECT pg_advisory_unlock_all()", "DISCARD TEMP", "DISCARD SEQUENCES"}

// resetSession resets conn (ResetSession) and checks its prepared
// statements; when they are not the host's, it deallocates them all, and
// the writes are prepared again as they run.
func resetSession(ctx context.Context, conn *pgx.Conn, schema string) error {
	if err := conn.PgConn().Exec(ctx, strings.Join(ResetSession, "; ")).Close(); err != nil {
		return err
	}
	if err := conn.PgConn().Exec(ctx, StatementsCheck(conn, schema)).Close(); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || conn.PgConn().TxStatus() != 'I' {
			return err
		}
		return forgetWrites(ctx, conn)
	}
	return nil
}

// reset holds the connections whose session was reset in the same round
// trip as their transaction's commit (MarkReset): going back to their
// pool, they need no second reset.
var reset sync.Map

// MarkReset records that conn was just reset with ResetSession and nothing
// ran on it since: its pool's AfterRelease skips the reset once.
func MarkReset(conn *pgx.Conn) { reset.Store(conn, true) }

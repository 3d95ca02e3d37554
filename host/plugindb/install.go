package plugindb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
)

// Spec is what an install puts in the database for one plugin.
type Spec struct {
	// Name is the plugin's name: its schema is plugin_<name>, its
	// schema role usher_schema_<name>, its login role
	// usher_plugin_<name>. Required.
	Name string
	// Version is recorded in plugin_installs. Required.
	Version string
	// Migrations holds the plugin's goose-style NNNNN_name.sql files
	// (only *.sql directly in it count). Nil: the plugin has no tables
	// of its own.
	Migrations fs.FS
	// MigrationsSHA256 is the manifest's checksum of Migrations
	// (pluginhost.MigrationsSHA256); files that do not match it are
	// refused. Required with Migrations.
	MigrationsSHA256 string
	// Grants are the plugin's column privileges outside its schema.
	Grants []pluginhost.Grant
}

// VerifyBinary refuses p when its binary's SHA-256 is not the manifest's:
// the install is then not that of the binary a host would run. (A host
// needs no such call: go-plugin checks the binary it starts.)
func VerifyBinary(p pluginhost.DirPlugin) error {
	sum, err := pluginhost.FileSHA256(p.BinaryPath)
	if err != nil {
		return err
	}
	if sum != p.Manifest.SHA256 {
		return fmt.Errorf("plugin %s is refused: binary %s has sha256 %s, not the manifest's %s", p.Manifest.Name, p.BinaryPath, sum, p.Manifest.SHA256)
	}
	return nil
}

// FromManifest is the install of the plugin p found in a plugin
// directory: its migrations directory and grants. The migrations'
// checksum is checked by Install.
func FromManifest(p pluginhost.DirPlugin) (Spec, error) {
	s := Spec{Name: p.Manifest.Name, Version: p.Manifest.Version, Grants: p.Manifest.Grants, MigrationsSHA256: p.Manifest.MigrationsSHA256}
	if dir := p.Manifest.MigrationsDir(dirOf(p.ManifestPath)); dir != "" {
		info, err := os.Stat(dir)
		if err != nil {
			return Spec{}, fmt.Errorf("plugin %s: migrations: %w", p.Manifest.Name, err)
		}
		if !info.IsDir() {
			return Spec{}, fmt.Errorf("plugin %s: migrations %s is not a directory", p.Manifest.Name, dir)
		}
		s.Migrations = os.DirFS(dir)
	}
	return s, nil
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, os.PathSeparator); i >= 0 {
		return path[:i]
	}
	return "."
}

// Result is what an install did.
type Result struct {
	// Unchanged: the same migrations and grants were installed before;
	// nothing was done.
	Unchanged bool
	// Applied names the migration files applied now.
	Applied []string
	// Granted describes each grant made on the application's tables;
	// Revoked names the tables whose grants were taken back because the
	// manifest no longer lists them.
	Granted, Revoked []string
}

// Install puts s in the database pool logs in to, as the runtime's owner
// (never a superuser), in one transaction, so that a refusal at any step
// leaves nothing behind:
//
//  1. the migrations' checksum must be the manifest's, and every file
//     passes the lexical check (no role switch, no GRANT, no SECURITY
//     DEFINER, ...);
//  2. the files not yet applied run as usher_schema_<name> (SET LOCAL
//     ROLE) with search_path plugin_<name>, tracked in
//     plugin_<name>.goose_db_version; after each statement the database
//     must still report that role;
//  3. the database must report no change outside the plugin's schema (a
//     catalog row of this transaction elsewhere, a row written elsewhere),
//     no privilege in the schema for any other role, and no SECURITY
//     DEFINER function;
//  4. the plugin's login role gets USAGE on its schema and SELECT, INSERT,
//     UPDATE, DELETE on its tables (no DDL, no TRUNCATE), and exactly the
//     declared grants on the application's tables; the grants of tables
//     the last install granted and s no longer lists are revoked;
//  5. plugin_installs records the install.
//
// The schema and its role come from `host setup --plugin NAME`; when the
// schema is missing and the owner may create schemas on the database (it
// owns it), Install creates it. A second Install of the same migrations
// and grants does nothing.
func Install(ctx context.Context, pool *pgxpool.Pool, s Spec) (Result, error) {
	var res Result
	if err := sandbox.CheckPluginName(s.Name); err != nil {
		return res, err
	}
	if s.Version == "" {
		return res, fmt.Errorf("plugin %s: install needs a version", s.Name)
	}
	var migs []migration
	sum := ""
	if s.Migrations != nil {
		var err error
		if sum, err = pluginhost.MigrationsSHA256(s.Migrations); err != nil {
			return res, fmt.Errorf("plugin %s: %w", s.Name, err)
		}
		if sum != s.MigrationsSHA256 {
			return res, fmt.Errorf("plugin %s is refused: its migrations have sha256 %s, not the manifest's migrations_sha256 %s (a file changed since the manifest was written: write it again with `host plugins manifest ... --migrations DIR --write`)",
				s.Name, sum, s.MigrationsSHA256)
		}
		if migs, err = readMigrations(s.Migrations); err != nil {
			return res, fmt.Errorf("plugin %s: %w", s.Name, err)
		}
	}
	grants, grantsJSON, err := normalize(s.Grants)
	if err != nil {
		return res, fmt.Errorf("plugin %s: %w", s.Name, err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	// The connection ran a plugin's SQL: it is closed, never reused, so
	// nothing a migration left in its session outlives the install.
	defer func() {
		c := conn.Hijack()
		_ = c.Close(context.WithoutCancel(ctx))
	}()
	// The roles are the database's deployment's (host setup
	// --deployment). Read before the transaction: its snapshot must be
	// taken after the lock that makes installs take turns (run).
	d, err := sandbox.DeploymentOf(ctx, conn)
	if err != nil {
		return res, err
	}
	if err := sandbox.CheckPluginNameIn(d, s.Name); err != nil {
		return res, err
	}
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		in := installer{tx: tx, s: s, name: s.Name, schema: sandbox.Schema(s.Name), schemaRole: sandbox.SchemaRoleIn(d, s.Name),
			role: sandbox.PluginRoleIn(d, s.Name), res: &res}
		return in.run(ctx, migs, sum, grants, grantsJSON)
	})
	if err != nil {
		return Result{}, fmt.Errorf("plugin %s: install: %w", s.Name, err)
	}
	return res, nil
}

type installer struct {
	tx                       pgx.Tx
	s                        Spec
	name, schema, schemaRole string
	role                     string
	res                      *Result
}

func (in installer) run(ctx context.Context, migs []migration, sum string, grants []pluginhost.Grant, grantsJSON []byte) error {
	// Installs take turns (two hosts loading one plugin at once would
	// grant on the same objects), on a lock no plugin role can take.
	if _, err := in.tx.Exec(ctx, `LOCK TABLE plugin_installs IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return err
	}
	var (
		oldSum     string
		oldGrants  []pluginhost.Grant
		same, seen bool
	)
	err := in.tx.QueryRow(ctx, `SELECT migrations_sha256, grants, migrations_sha256 = $2 AND grants = $3::jsonb FROM plugin_installs WHERE name = $1`,
		in.name, sum, string(grantsJSON)).Scan(&oldSum, &oldGrants, &same)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return err
	default:
		seen = true
	}
	if seen && same {
		in.res.Unchanged = true
		_, err := in.tx.Exec(ctx, `UPDATE plugin_installs SET version = $2 WHERE name = $1 AND version <> $2`, in.name, in.s.Version)
		return err
	}
	own := in.s.Migrations != nil
	if err := in.checkRoles(ctx, own); err != nil {
		return err
	}
	// A plugin without migrations has no tables of its own: its schema
	// (when setup made one) stays empty and unused.
	if own {
		if err := in.ensureSchema(ctx); err != nil {
			return err
		}
		before, err := in.fingerprint(ctx)
		if err != nil {
			return err
		}
		if err := in.migrate(ctx, migs); err != nil {
			return err
		}
		if err := in.checkContained(ctx, before); err != nil {
			return err
		}
		if err := in.grantSchema(ctx); err != nil {
			return err
		}
	}
	if err := in.grantApp(ctx, grants, oldGrants); err != nil {
		return err
	}
	_, err = in.tx.Exec(ctx, `INSERT INTO plugin_installs (name, version, migrations_sha256, grants) VALUES ($1, $2, $3, $4::jsonb)
		ON CONFLICT (name) DO UPDATE SET version = excluded.version, migrations_sha256 = excluded.migrations_sha256,
			grants = excluded.grants, installed_at = now()`, in.name, in.s.Version, sum, string(grantsJSON))
	return err
}

// checkRoles proves the roles setup makes exist, and that the runtime's
// owner may act as the schema role.
func (in installer) checkRoles(ctx context.Context, own bool) error {
	var schemaRole, login, member bool
	err := in.tx.QueryRow(ctx, `SELECT to_regrole($1) IS NOT NULL, to_regrole($2) IS NOT NULL,
		to_regrole($1) IS NOT NULL AND pg_has_role(current_user, $1, 'MEMBER')`, in.schemaRole, in.role).Scan(&schemaRole, &login, &member)
	if err != nil {
		return err
	}
	switch {
	case !login:
		return fmt.Errorf("plugin %s has no Postgres role %s: an administrator creates it once with `host setup --admin-url URL --plugin %s`", in.name, in.role, in.name)
	case !own:
	case !schemaRole:
		return fmt.Errorf("plugin %s has no schema role %s: an administrator creates it (and the schema %s) once with `host setup --admin-url URL --plugin %s`", in.name, in.schemaRole, in.schema, in.name)
	case !member:
		return fmt.Errorf("the host's login is not a member of %s, so it cannot run the plugin's migrations: run `host setup --admin-url URL --owner OWNER --plugin %s` with the host's login as OWNER", in.schemaRole, in.name)
	}
	return nil
}

// ensureSchema checks that plugin_<name> exists and is the schema role's,
// creating it when missing and the owner may.
func (in installer) ensureSchema(ctx context.Context) error {
	var owner *string
	err := in.tx.QueryRow(ctx, `SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = $1`, in.schema).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		q := "CREATE SCHEMA " + ident(in.schema) + " AUTHORIZATION " + ident(in.schemaRole)
		if _, err := in.tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("the schema %s does not exist and the host cannot create it (%w): an administrator creates it with `host setup --admin-url URL --plugin %s` on this database", in.schema, err, in.name)
		}
		_, err = in.tx.Exec(ctx, "REVOKE ALL ON SCHEMA "+ident(in.schema)+" FROM PUBLIC")
		return err
	}
	if err != nil {
		return err
	}
	if owner == nil || *owner != in.schemaRole {
		return fmt.Errorf("the schema %s belongs to %v, not to %s: a plugin's schema is its schema role's alone (ALTER SCHEMA %s OWNER TO %s, as an administrator, if it is the plugin's)",
			in.schema, deref(owner), in.schemaRole, in.schema, in.schemaRole)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "nobody"
	}
	return *s
}

// migrate runs the migrations not yet applied as the schema role.
func (in installer) migrate(ctx context.Context, migs []migration) error {
	for _, q := range []string{
		"SET LOCAL ROLE " + ident(in.schemaRole),
		"SET LOCAL search_path = " + ident(in.schema),
		`CREATE TABLE IF NOT EXISTS goose_db_version (
			id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
			version_id bigint NOT NULL,
			is_applied boolean NOT NULL,
			tstamp timestamp NOT NULL DEFAULT now())`,
		`INSERT INTO goose_db_version (version_id, is_applied) SELECT 0, true
			WHERE NOT EXISTS (SELECT 1 FROM goose_db_version)`,
	} {
		if _, err := in.tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("prepare the migrations: %w", err)
		}
	}
	rows, err := in.tx.Query(ctx, `SELECT version_id FROM goose_db_version WHERE is_applied`)
	if err != nil {
		return err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	for _, m := range migs {
		if slices.Contains(applied, m.version) {
			continue
		}
		for _, stmt := range m.stmts {
			if _, err := in.tx.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("migration %s is refused: %w", m.name, explain(err))
			}
			// SQL can build a role switch the lexical check cannot see:
			// the database says who is running.
			var user string
			if err := in.tx.QueryRow(ctx, `SELECT current_user::text`).Scan(&user); err != nil {
				return err
			}
			if user != in.schemaRole {
				return fmt.Errorf("migration %s is refused: a statement left the role %s (now %s)", m.name, in.schemaRole, user)
			}
		}
		if _, err := in.tx.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, m.version); err != nil {
			return err
		}
		in.res.Applied = append(in.res.Applied, m.name)
	}
	if _, err := in.tx.Exec(ctx, "SET LOCAL ROLE NONE"); err != nil {
		return err
	}
	_, err = in.tx.Exec(ctx, "SET LOCAL search_path TO DEFAULT")
	return err
}

// explain adds what a permission error means here.
func explain(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42501" {
		return fmt.Errorf("%w (a plugin's migration may create and change objects only in its own schema)", err)
	}
	return err
}

// others lists the schemas a migration must leave alone: all but the
// plugin's own and the ones Postgres fills for it (TOAST, temporary).
const others = `(SELECT oid FROM pg_namespace WHERE nspname <> $1 AND nspname <> 'pg_toast'
	AND nspname NOT LIKE 'pg\_temp\_%' AND nspname NOT LIKE 'pg\_toast\_temp\_%')`

// fingerprint counts the objects outside the plugin's schema, so that a
// drop there (a deleted catalog row leaves no xmin to see) shows, and the
// rows written so far in each table outside it: the statistics of earlier
// transactions on the connection may not be flushed yet, so writes are
// counted from this baseline.
type fingerprint struct {
	objects string
	writes  string // jsonb: relid -> rows written
}

func (in installer) fingerprint(ctx context.Context) (fingerprint, error) {
	var fp fingerprint
	err := in.tx.QueryRow(ctx, `SELECT coalesce(jsonb_object_agg(s.relid::text, s.n_tup_ins + s.n_tup_upd + s.n_tup_del), '{}')::text
		FROM pg_stat_xact_all_tables s WHERE s.relid IN (SELECT oid FROM pg_class WHERE relnamespace IN `+others+`)`, in.schema).Scan(&fp.writes)
	if err != nil {
		return fp, err
	}
	err = in.tx.QueryRow(ctx, `SELECT concat_ws('/',
		(SELECT count(*) FROM pg_class WHERE relnamespace IN `+others+`),
		(SELECT count(*) FROM pg_proc WHERE pronamespace IN `+others+`),
		(SELECT count(*) FROM pg_type WHERE typnamespace IN `+others+`),
		(SELECT count(*) FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid WHERE c.relnamespace IN `+others+`),
		(SELECT count(*) FROM pg_constraint WHERE connamespace IN `+others+`),
		(SELECT count(*) FROM pg_namespace WHERE oid IN `+others+`))`, in.schema).Scan(&fp.objects)
	return fp, err
}

// checkContained asks the database what the migrations changed: nothing
// outside the plugin's schema, no privilege in it for another role, no
// function that runs as its owner.
func (in installer) checkContained(ctx context.Context, before fingerprint) error {
	after, err := in.fingerprint(ctx)
	if err != nil {
		return err
	}
	if after.objects != before.objects {
		return fmt.Errorf("the migrations dropped or created objects outside the schema %s (catalog counts %s, then %s)", in.schema, before.objects, after.objects)
	}
	rows, err := in.tx.Query(ctx, `
		WITH x AS (SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text::xid AS id)
		SELECT 'relation ' || c.oid::regclass::text FROM pg_class c, x WHERE c.xmin = x.id AND c.relnamespace IN `+others+`
		UNION ALL SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p, x WHERE p.xmin = x.id AND p.pronamespace IN `+others+`
		UNION ALL SELECT 'type ' || t.oid::regtype::text FROM pg_type t, x WHERE t.xmin = x.id AND t.typnamespace IN `+others+`
		UNION ALL SELECT 'schema ' || n.nspname FROM pg_namespace n, x WHERE n.xmin = x.id AND n.nspname <> $1
		UNION ALL SELECT 'trigger ' || tg.tgname || ' on ' || tg.tgrelid::regclass::text FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid, x
			WHERE tg.xmin = x.id AND c.relnamespace IN `+others+`
		UNION ALL SELECT 'constraint ' || co.conname FROM pg_constraint co, x WHERE co.xmin = x.id AND co.connamespace IN `+others+`
		UNION ALL SELECT 'policy ' || po.polname FROM pg_policy po JOIN pg_class c ON c.oid = po.polrelid, x
			WHERE po.xmin = x.id AND c.relnamespace IN `+others+`
		UNION ALL SELECT 'rule ' || r.rulename FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class, x
			WHERE r.xmin = x.id AND c.relnamespace IN `+others+`
		UNION ALL SELECT 'default privileges' FROM pg_default_acl d, x WHERE d.xmin = x.id
		UNION ALL SELECT 'extension ' || e.extname FROM pg_extension e, x WHERE e.xmin = x.id
		UNION ALL SELECT 'rows written in ' || s.schemaname || '.' || s.relname FROM pg_stat_xact_all_tables s
			WHERE s.schemaname <> $1 AND s.schemaname NOT IN ('pg_catalog', 'pg_toast', 'information_schema')
			  AND s.schemaname NOT LIKE 'pg\_temp\_%' AND s.schemaname NOT LIKE 'pg\_toast\_temp\_%'
			  AND s.n_tup_ins + s.n_tup_upd + s.n_tup_del > coalesce(($4::jsonb ->> s.relid::text)::bigint, 0)
		UNION ALL SELECT 'a privilege on ' || c.oid::regclass::text || ' for ' || coalesce(r.rolname, 'PUBLIC')
			FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
			WHERE c.relnamespace = to_regnamespace($1) AND a.grantee <> ALL(ARRAY[to_regrole($2)::oid, to_regrole($3)::oid])
		UNION ALL SELECT 'a privilege on function ' || p.oid::regprocedure::text || ' for ' || coalesce(r.rolname, 'PUBLIC')
			FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
			WHERE p.pronamespace = to_regnamespace($1) AND a.grantee <> ALL(ARRAY[to_regrole($2)::oid, to_regrole($3)::oid])
		UNION ALL SELECT 'a privilege on schema ' || n.nspname || ' for ' || coalesce(r.rolname, 'PUBLIC')
			FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
			WHERE n.nspname = $1 AND a.grantee <> ALL(ARRAY[to_regrole($2)::oid, to_regrole($3)::oid, n.nspowner])
		UNION ALL SELECT 'SECURITY DEFINER function ' || p.oid::regprocedure::text FROM pg_proc p
			WHERE p.pronamespace = to_regnamespace($1) AND p.prosecdef
		UNION ALL SELECT 'object not owned by ' || $2 || ': ' || c.oid::regclass::text FROM pg_class c
			WHERE c.relnamespace = to_regnamespace($1) AND c.relowner <> to_regrole($2)`,
		in.schema, in.schemaRole, in.role, before.writes)
	if err != nil {
		return err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(found) > 0 {
		return fmt.Errorf("the migrations are refused: the database reports %s (a plugin's migrations may change only its own schema, grant nothing and define no SECURITY DEFINER function)",
			strings.Join(found, "; "))
	}
	return nil
}

// grantSchema gives the plugin's login role its own tables' rows: USAGE
// on the schema, SELECT, INSERT, UPDATE, DELETE on every table and the
// sequences behind their serial columns. Never the version table, never
// DDL or TRUNCATE (it owns nothing).
func (in installer) grantSchema(ctx context.Context) error {
	s, r := ident(in.schema), ident(in.role)
	qs := []string{
		"SET LOCAL ROLE " + ident(in.schemaRole),
		"REVOKE ALL ON ALL TABLES IN SCHEMA " + s + " FROM " + r,
		"REVOKE ALL ON ALL SEQUENCES IN SCHEMA " + s + " FROM " + r,
		"GRANT USAGE ON SCHEMA " + s + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + s + " TO " + r,
		"REVOKE ALL ON " + s + ".goose_db_version FROM " + r,
	}
	// The sequences behind the plugin's tables' serial and identity
	// columns, not the version table's.
	rows, err := in.tx.Query(ctx, `SELECT d.objid::regclass::text FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
		WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
		  AND c.relnamespace = to_regnamespace($1) AND c.relname <> 'goose_db_version'
		  AND (SELECT relkind FROM pg_class WHERE oid = d.objid) = 'S'`, in.schema)
	if err != nil {
		return err
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(seqs) > 0 {
		qs = append(qs, "GRANT USAGE, SELECT ON SEQUENCE "+strings.Join(seqs, ", ")+" TO "+r)
	}
	for _, q := range append(qs, "SET LOCAL ROLE NONE") {
		if _, err := in.tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// grantApp makes the plugin's privileges on tables outside its schema
// exactly grants: every table it names or the last install named loses
// all the role's privileges, then gets the listed columns.
func (in installer) grantApp(ctx context.Context, grants, old []pluginhost.Grant) error {
	r := ident(in.role)
	listed := map[string]bool{}
	for _, g := range grants {
		listed[g.Table] = true
		if err := in.checkTable(ctx, g.Table); err != nil {
			return err
		}
	}
	for _, g := range old {
		var exists bool
		if err := in.tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, g.Table).Scan(&exists); err != nil {
			return err
		}
		if !exists || listed[g.Table] {
			continue
		}
		if _, err := in.tx.Exec(ctx, "REVOKE ALL ON TABLE "+table(g.Table)+" FROM "+r); err != nil {
			return fmt.Errorf("revoke %s's grants on %s: %w", in.role, g.Table, err)
		}
		in.res.Revoked = append(in.res.Revoked, g.Table)
	}
	for _, g := range grants {
		if _, err := in.tx.Exec(ctx, "REVOKE ALL ON TABLE "+table(g.Table)+" FROM "+r); err != nil {
			return fmt.Errorf("grant on %s: %w (the host's login must own the table or hold its privileges WITH GRANT OPTION)", g.Table, err)
		}
		var privs, desc []string
		for _, p := range []struct {
			name string
			cols []string
		}{{"SELECT", g.Select}, {"INSERT", g.Insert}, {"UPDATE", g.Update}} {
			if len(p.cols) == 0 {
				continue
			}
			quoted := make([]string, len(p.cols))
			for i, c := range p.cols {
				quoted[i] = ident(c)
			}
			privs = append(privs, p.name+" ("+strings.Join(quoted, ", ")+")")
			desc = append(desc, p.name+" ("+strings.Join(p.cols, ", ")+")")
		}
		q := "GRANT " + strings.Join(privs, ", ") + " ON TABLE " + table(g.Table) + " TO " + r
		if _, err := in.tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w (the host's login must own the table or hold its privileges WITH GRANT OPTION)", q, err)
		}
		in.res.Granted = append(in.res.Granted, strings.Join(desc, ", ")+" ON "+g.Table)
	}
	return nil
}

// checkTable refuses a grant on a table that is missing, in a plugin's
// schema (its own is granted whole; another's is not its to have), or one
// of the runtime's.
func (in installer) checkTable(ctx context.Context, t string) error {
	var (
		schema, name *string
	)
	err := in.tx.QueryRow(ctx, `SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, t).Scan(&schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("the manifest grants on %s, which does not exist: migrate the application's tables before installing its plugins", t)
	}
	if err != nil {
		return err
	}
	var current string
	if err := in.tx.QueryRow(ctx, `SELECT current_schema()::text`).Scan(&current); err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(*schema, "plugin_"):
		return fmt.Errorf("the manifest grants on %s.%s, in a plugin's schema: a plugin has its own schema's tables without a grant, and never another plugin's", *schema, *name)
	case *schema == current && slices.Contains(sandbox.RuntimeTables, *name):
		return fmt.Errorf("the manifest grants on %s, one of the runtime's tables: no plugin may hold a privilege on them", *name)
	}
	return nil
}

// normalize sorts grants (by table, columns by name) so that two manifests
// listing the same privileges in another order compare equal, and refuses
// a table listed twice.
func normalize(gs []pluginhost.Grant) ([]pluginhost.Grant, []byte, error) {
	out := make([]pluginhost.Grant, len(gs))
	seen := map[string]bool{}
	for i, g := range gs {
		if seen[g.Table] {
			return nil, nil, fmt.Errorf("the manifest lists table %s twice in its grants", g.Table)
		}
		seen[g.Table] = true
		g.Select, g.Update, g.Insert = sorted(g.Select), sorted(g.Update), sorted(g.Insert)
		out[i] = g
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Table < out[j].Table })
	b, err := json.Marshal(out)
	return out, b, err
}

func sorted(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(s)))
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

func table(t string) string { return pgx.Identifier(strings.Split(t, ".")).Sanitize() }

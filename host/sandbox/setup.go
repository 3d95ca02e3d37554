package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SetupConfig is what an administrator's Setup creates.
type SetupConfig struct {
	// Deployment names this usher deployment (its database) among the
	// others on the same cluster, whose roles are the cluster's, not the
	// database's: every role it creates carries it (see PluginRoleIn).
	// Default "": the names of a cluster with one deployment
	// (usher_plugin_<name>).
	Deployment string
	// Owner is the runtime's owner role, the host's login: it owns the
	// runtime's tables and functions and is not a superuser. Default
	// OwnerIn(Deployment): "usher", or "usher_<deployment>".
	Owner string
	// PluginConnectionLimit is every plugin role's CONNECTION LIMIT: the
	// sessions it may hold on the cluster at once, all hosts' pools
	// together (a plugin cannot change it). Default
	// DefaultPluginConnectionLimit; negative: no limit.
	PluginConnectionLimit int
	// Adopt takes over an existing role that carries no deployment's mark
	// even when another database uses it (one set up before deployments
	// were named). Default false: such a role is refused, since it may
	// be another deployment's.
	Adopt bool
	// RolesOnly makes, marks and checks the roles and nothing in the
	// database admin is connected to (no grant, no plugin schema, no
	// record of the deployment): for a kit that makes the roles from one
	// database and sets up each database it creates itself (hosttest).
	// Default false.
	RolesOnly bool
	// OwnerPassword, when set, is the owner's password (stored as a
	// SCRAM-SHA-256 verifier computed here: the password never reaches
	// the server in clear).
	OwnerPassword string
	// Plugins names the plugins whose login roles to create.
	Plugins []string
	// PluginPasswords holds a password per plugin name, set like the
	// owner's. A plugin with none gets no password (trust or certificate
	// authentication).
	PluginPasswords map[string]string
}

// Setup creates the owner and the plugins' login roles when missing and
// sets their passwords, on the database admin is connected to. It needs a
// superuser or a role with CREATEROLE, once; the host itself never does.
// The owner may create tables in the current schema. Each plugin also gets
// its schema, plugin_<name>, owned by the NOLOGIN role usher_schema_<name>
// of which the owner is a member, so the host can later apply the plugin's
// migrations there without any administrator (package plugindb); plugin
// roles get no privilege here. It is safe to run again.
//
// Each role is marked with its deployment and database (a comment on the
// role), and Setup refuses to take over a role marked for another, or one
// with no mark that another database uses (unless Adopt): two deployments
// on one cluster never share a role, nor reset each other's passwords.
func Setup(ctx context.Context, admin *pgx.Conn, c SetupConfig) error {
	if err := CheckDeployment(c.Deployment); err != nil {
		return err
	}
	if c.Owner == "" {
		c.Owner = OwnerIn(c.Deployment)
	}
	switch {
	case c.PluginConnectionLimit == 0:
		c.PluginConnectionLimit = DefaultPluginConnectionLimit
	case c.PluginConnectionLimit < 0:
		c.PluginConnectionLimit = -1
	}
	for _, p := range c.Plugins {
		if err := CheckPluginNameIn(c.Deployment, p); err != nil {
			return err
		}
	}
	// Roles are the cluster's: ALTER ROLE of one role from two sessions at
	// once fails ("tuple concurrently updated"), so setups take turns.
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(hashtext('usher_sandbox_setup'))`); err != nil {
		return fmt.Errorf("sandbox: setup: %w", err)
	}
	defer admin.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext('usher_sandbox_setup'))`)
	var schema, db string
	if err := admin.QueryRow(ctx, `SELECT current_schema()::text, current_database()::text`).Scan(&schema, &db); err != nil {
		return fmt.Errorf("sandbox: setup: %w", err)
	}
	mark := deploymentMark(c.Deployment, db)
	roles := []string{c.Owner}
	for _, p := range c.Plugins {
		roles = append(roles, PluginRoleIn(c.Deployment, p), SchemaRoleIn(c.Deployment, p))
	}
	// Every role is checked before any is changed.
	for _, r := range roles {
		if err := checkOwnership(ctx, admin, r, mark, c.Adopt); err != nil {
			return err
		}
	}
	if !c.RolesOnly {
		if err := recordDeployment(ctx, admin, c.Deployment, db); err != nil {
			return err
		}
	}
	if err := ensureRole(ctx, admin, c.Owner, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS", c.OwnerPassword, mark); err != nil {
		return err
	}
	owner := pgx.Identifier{c.Owner}.Sanitize()
	for _, q := range []string{
		fmt.Sprintf("GRANT CONNECT, TEMPORARY ON DATABASE %s TO %s", pgx.Identifier{db}.Sanitize(), owner),
		fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), owner),
	} {
		if c.RolesOnly {
			break
		}
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("sandbox: setup: %s: %w", q, err)
		}
	}
	for _, p := range c.Plugins {
		role := PluginRoleIn(c.Deployment, p)
		// NOINHERIT and no memberships: whatever is granted later, the
		// role has only its own privileges. Its CONNECTION LIMIT bounds
		// what it can hold however it logs in.
		attrs := fmt.Sprintf("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT CONNECTION LIMIT %d", c.PluginConnectionLimit)
		if err := ensureRole(ctx, admin, role, attrs, c.PluginPasswords[p], mark); err != nil {
			return err
		}
		if err := setupSchema(ctx, admin, c.Deployment, c.Owner, p, mark, c.RolesOnly); err != nil {
			return err
		}
	}
	return nil
}

// setupSchema creates plugin p's schema role (NOLOGIN: nobody logs in as
// it), makes the owner a member so that the host can run the plugin's
// migrations as it (SET ROLE), and creates the schema plugin_<p> it owns
// on admin's database. The plugin's login role is not a member: it gets
// only what an install grants it on the schema's tables.
func setupSchema(ctx context.Context, admin *pgx.Conn, deployment, owner, p, mark string, rolesOnly bool) error {
	role := SchemaRoleIn(deployment, p)
	if err := ensureRole(ctx, admin, role, "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT", "", mark); err != nil {
		return err
	}
	r, o, schema := pgx.Identifier{role}.Sanitize(), pgx.Identifier{owner}.Sanitize(), pgx.Identifier{Schema(p)}.Sanitize()
	qs := []string{"GRANT " + r + " TO " + o}
	if !rolesOnly {
		qs = append(qs,
			"CREATE SCHEMA IF NOT EXISTS "+schema+" AUTHORIZATION "+r,
			"ALTER SCHEMA "+schema+" OWNER TO "+r,
			"REVOKE ALL ON SCHEMA "+schema+" FROM PUBLIC")
	}
	for _, q := range qs {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("sandbox: setup: %s: %w", q, err)
		}
	}
	return nil
}

func ensureRole(ctx context.Context, admin *pgx.Conn, role, attrs, password, mark string) error {
	name := pgx.Identifier{role}.Sanitize()
	_, err := admin.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s) THEN
			CREATE ROLE %s;
		END IF;
	EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; -- created concurrently
	END $$`, quoteLiteral(role), name))
	if err != nil {
		return fmt.Errorf("sandbox: create role %s: %w", role, err)
	}
	q := "ALTER ROLE " + name + " " + attrs
	if password != "" {
		v, err := ScramVerifier(password)
		if err != nil {
			return err
		}
		q += " PASSWORD " + quoteLiteral(v)
	}
	if _, err := admin.Exec(ctx, q); err != nil {
		return fmt.Errorf("sandbox: alter role %s: %w", role, err)
	}
	if _, err := admin.Exec(ctx, "COMMENT ON ROLE "+name+" IS "+quoteLiteral(mark)); err != nil {
		return fmt.Errorf("sandbox: mark role %s: %w", role, err)
	}
	return nil
}

// DefaultPluginConnectionLimit is SetupConfig.PluginConnectionLimit's
// default: room for 8 hosts at the default plugin pool size of 4.
const DefaultPluginConnectionLimit = 32

// markPrefix begins the comment Setup marks its roles with.
const markPrefix = "usher deployment "

// deploymentMark is the comment of a role of deployment on database db.
func deploymentMark(deployment, db string) string {
	if deployment == "" {
		deployment = "(default)"
	}
	return markPrefix + deployment + " on database " + db
}

// checkOwnership refuses role when it exists and belongs to another
// deployment: marked for another (deployment, database), or unmarked and
// used by another database (it owns objects or holds privileges there, or
// owns it), unless adopt.
func checkOwnership(ctx context.Context, admin *pgx.Conn, role, mark string, adopt bool) error {
	var (
		comment *string
		others  []string
	)
	err := admin.QueryRow(ctx, `
		SELECT shobj_description(r.oid, 'pg_authid'),
		       coalesce(array(SELECT DISTINCT d.datname::text FROM pg_shdepend s JOIN pg_database d
		                        ON d.oid = CASE WHEN s.classid = 'pg_database'::regclass THEN s.objid ELSE s.dbid END
		                      WHERE s.refclassid = 'pg_authid'::regclass AND s.refobjid = r.oid
		                        AND d.datname <> current_database()
		                      UNION SELECT datname::text FROM pg_database WHERE datdba = r.oid AND datname <> current_database()
		                      ORDER BY 1), '{}')
		FROM pg_roles r WHERE r.rolname = $1`, role).Scan(&comment, &others)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sandbox: setup: look up role %s: %w", role, err)
	}
	switch {
	case comment != nil && *comment == mark:
		return nil
	case comment != nil && strings.HasPrefix(*comment, markPrefix):
		return fmt.Errorf("sandbox: setup refused: role %s belongs to %s, not to this one (%s): give this deployment a name of its own (--deployment NAME), so its roles are its own",
			role, strings.TrimPrefix(*comment, "usher "), strings.TrimPrefix(mark, "usher "))
	case len(others) > 0 && !adopt:
		return fmt.Errorf("sandbox: setup refused: role %s exists, carries no deployment's mark, and database %s uses it: it may be another deployment's; give this deployment a name of its own (--deployment NAME), or, if the role is this deployment's, take it over with --adopt",
			role, strings.Join(others, ", "))
	}
	return nil
}

// DeploymentSetting is the database setting (ALTER DATABASE ... SET) that
// records the deployment a database belongs to: its hosts find their
// plugins' roles by it (PluginRoleOf), with no flag of their own.
const DeploymentSetting = "usher.deployment"

// recordDeployment records deployment on database db, and refuses when
// db is recorded as another's.
func recordDeployment(ctx context.Context, admin *pgx.Conn, deployment, db string) error {
	var was string
	err := admin.QueryRow(ctx, `SELECT coalesce((SELECT substr(c, length($1) + 2) FROM pg_db_role_setting s, unnest(s.setconfig) c
		WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()) AND s.setrole = 0
		  AND c LIKE $1 || '=%'), '')`, DeploymentSetting).Scan(&was)
	if err != nil {
		return fmt.Errorf("sandbox: setup: %w", err)
	}
	switch {
	case was == deployment:
		return nil
	case was != "":
		return fmt.Errorf("sandbox: setup refused: database %s belongs to usher deployment %s; run setup with --deployment %s", db, was, was)
	}
	q := "ALTER DATABASE " + pgx.Identifier{db}.Sanitize() + " SET " + DeploymentSetting + " = " + quoteLiteral(deployment)
	if _, err := admin.Exec(ctx, q); err != nil {
		return fmt.Errorf("sandbox: setup: record the deployment: %s: %w (the administrator must own the database or be a superuser)", q, err)
	}
	return nil
}

// DeploymentOf is the deployment the database q is connected to belongs
// to (DeploymentSetting, set by Setup): "" when none was named.
func DeploymentOf(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (string, error) {
	var d string
	if err := q.QueryRow(ctx, `SELECT coalesce(current_setting($1, true), '')`, DeploymentSetting).Scan(&d); err != nil {
		return "", fmt.Errorf("sandbox: look up the deployment: %w", err)
	}
	if err := CheckDeployment(d); err != nil {
		return "", fmt.Errorf("the database's %s setting: %w", DeploymentSetting, err)
	}
	return d, nil
}

// PluginRoleOf is plugin name's login role in the deployment of the
// database q is connected to (DeploymentOf, PluginRoleIn).
func PluginRoleOf(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, name string) (string, error) {
	d, err := DeploymentOf(ctx, q)
	if err != nil {
		return "", err
	}
	if err := CheckPluginNameIn(d, name); err != nil {
		return "", err
	}
	return PluginRoleIn(d, name), nil
}

// CheckDeployment refuses a deployment name that is not lower-case letters
// and digits, starting with a letter, at most 16 bytes ("" is the default
// deployment): its roles are then usher_<deployment>_..., which no other
// deployment's, nor the default one's, can be.
func CheckDeployment(d string) error {
	if d == "" {
		return nil
	}
	ok := len(d) <= 16 && d[0] >= 'a' && d[0] <= 'z' && d != "plugin" && d != "schema"
	for _, c := range d {
		ok = ok && (c >= 'a' && c <= 'z' || c >= '0' && c <= '9')
	}
	if !ok {
		return fmt.Errorf("deployment name %q is refused: lower-case letters and digits, starting with a letter, at most 16 bytes, not \"plugin\" or \"schema\" (it prefixes the deployment's Postgres roles, usher_<deployment>_...)", d)
	}
	return nil
}

// OwnerIn is the default owner role of deployment: "usher", or
// "usher_<deployment>".
func OwnerIn(deployment string) string {
	if deployment == "" {
		return "usher"
	}
	return "usher_" + deployment
}

// PluginRoleIn is plugin name's login role in deployment:
// usher_<deployment>_plugin_<name> (PluginRole in the default one).
func PluginRoleIn(deployment, name string) string {
	if deployment == "" {
		return PluginRole(name)
	}
	return cut63("usher_" + deployment + "_plugin_" + PluginRole(name)[len(RolePrefix):])
}

// SchemaRoleIn is plugin name's schema role in deployment:
// usher_<deployment>_schema_<name> (SchemaRole in the default one).
func SchemaRoleIn(deployment, name string) string {
	if deployment == "" {
		return SchemaRole(name)
	}
	return cut63("usher_" + deployment + "_schema_" + name)
}

// CheckPluginNameIn is CheckPluginName, and refuses a name too long for
// its roles in deployment to keep it whole.
func CheckPluginNameIn(deployment, name string) error {
	if err := CheckPluginName(name); err != nil {
		return err
	}
	if n := len("usher_" + deployment + "_plugin_" + name); deployment != "" && n > 63 {
		return fmt.Errorf("plugin name %q is refused in deployment %s: its role would be %d bytes, more than Postgres's 63", name, deployment, n)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ScramVerifier computes the SCRAM-SHA-256 verifier Postgres stores for
// password (RFC 5802/7677, as libpq's PQencryptPasswordConn does), so a
// password set with it never travels or is logged in clear.
func ScramVerifier(password string) (string, error) {
	if password == "" {
		return "", errors.New("sandbox: empty password")
	}
	const iterations = 4096
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", err
	}
	clientKey := mac(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func mac(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

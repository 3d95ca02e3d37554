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
	// Owner is the runtime's owner role, the host's login: it owns the
	// runtime's tables and functions and is not a superuser. Default
	// "usher".
	Owner string
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
func Setup(ctx context.Context, admin *pgx.Conn, c SetupConfig) error {
	if c.Owner == "" {
		c.Owner = "usher"
	}
	// Roles are the cluster's: ALTER ROLE of one role from two sessions at
	// once fails ("tuple concurrently updated"), so setups take turns.
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(hashtext('usher_sandbox_setup'))`); err != nil {
		return fmt.Errorf("sandbox: setup: %w", err)
	}
	defer admin.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext('usher_sandbox_setup'))`)
	if err := ensureRole(ctx, admin, c.Owner, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS", c.OwnerPassword); err != nil {
		return err
	}
	var schema, db string
	if err := admin.QueryRow(ctx, `SELECT current_schema()::text, current_database()::text`).Scan(&schema, &db); err != nil {
		return fmt.Errorf("sandbox: setup: %w", err)
	}
	owner := pgx.Identifier{c.Owner}.Sanitize()
	for _, q := range []string{
		fmt.Sprintf("GRANT CONNECT, TEMPORARY ON DATABASE %s TO %s", pgx.Identifier{db}.Sanitize(), owner),
		fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), owner),
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("sandbox: setup: %s: %w", q, err)
		}
	}
	for _, p := range c.Plugins {
		role := PluginRole(p)
		// NOINHERIT and no memberships: whatever is granted later, the
		// role has only its own privileges.
		if err := ensureRole(ctx, admin, role, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT", c.PluginPasswords[p]); err != nil {
			return err
		}
		if err := setupSchema(ctx, admin, c.Owner, p); err != nil {
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
func setupSchema(ctx context.Context, admin *pgx.Conn, owner, p string) error {
	role := SchemaRole(p)
	if err := ensureRole(ctx, admin, role, "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT", ""); err != nil {
		return err
	}
	r, o, schema := pgx.Identifier{role}.Sanitize(), pgx.Identifier{owner}.Sanitize(), pgx.Identifier{Schema(p)}.Sanitize()
	for _, q := range []string{
		"GRANT " + r + " TO " + o,
		"CREATE SCHEMA IF NOT EXISTS " + schema + " AUTHORIZATION " + r,
		"ALTER SCHEMA " + schema + " OWNER TO " + r,
		"REVOKE ALL ON SCHEMA " + schema + " FROM PUBLIC",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("sandbox: setup: %s: %w", q, err)
		}
	}
	return nil
}

func ensureRole(ctx context.Context, admin *pgx.Conn, role, attrs, password string) error {
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

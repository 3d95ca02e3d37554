package plugindb

import (
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// migration is one of a plugin's migration files, its Up section split
// into statements the way goose splits them.
type migration struct {
	version int64
	name    string
	stmts   []string
}

// fileName is goose's: a version number, _, a name, .sql.
var fileName = regexp.MustCompile(`^([0-9]+)_[A-Za-z0-9_.-]+\.sql$`)

// readMigrations reads every *.sql file directly in fsys (the files
// MigrationsSHA256 covers), in version order, and refuses a file that is
// not goose-style, two files of one version, or a file the lexical check
// refuses.
func readMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := map[int64]string{}
	for _, n := range names {
		m := fileName.FindStringSubmatch(n)
		if m == nil {
			return nil, fmt.Errorf("migration %s: a migration file is named NNNNN_name.sql", n)
		}
		v, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: version %q is not a positive number", n, m[1])
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, n, v)
		}
		seen[v] = n
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		stmts, err := parseUp(string(b))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", n, err)
		}
		if err := lexicalCheck(stmts); err != nil {
			return nil, fmt.Errorf("migration %s is refused: %w", n, err)
		}
		out = append(out, migration{version: v, name: n, stmts: stmts})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// parseUp returns the statements of a goose file's Up section: each ends
// at a line ending in ";", or spans -- +goose StatementBegin to
// StatementEnd. A file that asks for no transaction is refused: a plugin's
// migration runs in the install's transaction, so that a refused one
// leaves nothing behind.
func parseUp(text string) ([]string, error) {
	var (
		stmts      []string
		buf        strings.Builder
		up, inside bool
		sawUp      bool
	)
	flush := func() {
		if s := strings.TrimSpace(buf.String()); s != "" && !onlyComments(s) {
			stmts = append(stmts, s)
		}
		buf.Reset()
	}
	for _, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(t, "-- +goose "); ok {
			switch strings.ToLower(strings.TrimSpace(rest)) {
			case "up":
				up, sawUp = true, true
			case "down":
				if inside {
					return nil, fmt.Errorf("-- +goose Down inside a StatementBegin block")
				}
				flush()
				up = false
			case "statementbegin":
				if up {
					flush()
					inside = true
				}
			case "statementend":
				if up {
					if !inside {
						return nil, fmt.Errorf("-- +goose StatementEnd without StatementBegin")
					}
					flush()
					inside = false
				}
			case "no transaction":
				return nil, fmt.Errorf("-- +goose NO TRANSACTION: a plugin's migration runs inside the install's transaction")
			default:
				return nil, fmt.Errorf("unknown annotation %q", t)
			}
			continue
		}
		if !up {
			continue
		}
		buf.WriteString(line)
		buf.WriteByte('\n')
		if !inside && endsStatement(t) {
			flush()
		}
	}
	if inside {
		return nil, fmt.Errorf("-- +goose StatementBegin without StatementEnd")
	}
	if !sawUp {
		return nil, fmt.Errorf("no -- +goose Up section")
	}
	if s := strings.TrimSpace(buf.String()); s != "" && !onlyComments(s) {
		return nil, fmt.Errorf("the last statement has no terminating semicolon: %.60q", s)
	}
	return stmts, nil
}

func endsStatement(line string) bool {
	if i := strings.Index(line, "--"); i >= 0 {
		line = strings.TrimSpace(line[:i])
	}
	return strings.HasSuffix(line, ";")
}

func onlyComments(s string) bool {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}

// refused are the statements a plugin's migration may not contain, by
// their words, whatever the database would say: switching role (SQL can
// always switch back to the session's role, the runtime's owner),
// granting, changing roles, and functions that run as their owner. The
// database's own checks after every statement and at the end of the
// install (see install) stand behind these; this check is what gives a
// plain mistake a clear message before anything runs.
var refused = []struct {
	re  *regexp.Regexp
	why string
}{
	{words(`\breset\s+(role|all|session)\b`), "RESET ROLE: a migration runs as the plugin's schema role and cannot leave it"},
	{words(`\bset\s+(local\s+|session\s+)?role\b`), "SET ROLE: a migration runs as the plugin's schema role and cannot leave it"},
	{words(`\bsession\s+authorization\b`), "SET SESSION AUTHORIZATION: a migration runs as the plugin's schema role and cannot leave it"},
	{words(`\bset_config\b`), "set_config: a migration may not change settings through a function (set_config('role', ...) would leave its role)"},
	{words(`\bsecurity\s+definer\b`), "SECURITY DEFINER: a function of the plugin's schema runs as its caller"},
	{words(`\bgrant\b`), "GRANT: the host grants the plugin's role what its schema's tables need, and the manifest declares the rest"},
	{words(`\brevoke\b`), "REVOKE: the host manages the grants of the plugin's schema"},
	{words(`\bdefault\s+privileges\b`), "ALTER DEFAULT PRIVILEGES: the host manages the grants of the plugin's schema"},
	{words(`\b(alter|create|drop)\s+(role|user|group)\b`), "roles are an administrator's (host setup)"},
	{words(`\b(create|alter|drop)\s+schema\b`), "schemas are an administrator's: a plugin's tables live in plugin_<name>, which host setup creates"},
	// Dynamic SQL builds a statement these words cannot see: EXECUTE
	// 'RES' || 'ET ROLE' leaves the schema role for the session's (the
	// runtime's owner) and can read what it may. The database's checks
	// catch writes and DDL outside the schema, not reads, so no dynamic
	// SQL at all: no DO block, no EXECUTE, no function that runs a query
	// given as text.
	{regexp.MustCompile(`/\*`), "a block comment (/* */): a comment between two words would hide them from this check; use -- comments"},
	{words(`^\s*do\b`), "DO: a migration may not run anonymous code blocks (dynamic SQL could leave the schema role)"},
	{words(`\bexecute\b`), "EXECUTE: a migration may not run dynamic SQL (it could leave the schema role)"},
	{words(`\b(query_to_xml\w*|cursor_to_xml\w*|dblink\w*|lo_import|lo_export|pg_read_\w+|pg_ls_\w+)\b`),
		"a function that runs a query given as text, or reaches files or other databases, is not allowed in a migration"},
}

// words compiles a pattern of words, where \s+ between two words also
// matches a comment ending a line: SQL reads "RESET -- x" + newline +
// "ROLE" as RESET ROLE.
func words(pattern string) *regexp.Regexp {
	return regexp.MustCompile(strings.ReplaceAll(pattern, `\s+`, `(?:\s|--[^\n]*(?:\n|$))+`))
}

func lexicalCheck(stmts []string) error {
	for _, s := range stmts {
		// Whole-line comments say nothing to the database; a comment at
		// the end of a line of code is checked with it (stricter, and no
		// string literal can hide code behind a "--"). A line that starts
		// with "--" but holds a quote is checked too: inside a string
		// literal (a function's body) it is not a comment, and its quote
		// can end the literal and leave code on the line.
		var code []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") || strings.ContainsAny(l, `'$"`) {
				code = append(code, l)
			}
		}
		low := strings.ToLower(strings.Join(code, "\n"))
		for _, r := range refused {
			if r.re.MatchString(low) {
				return fmt.Errorf("%s (in %.80q)", r.why, strings.Join(strings.Fields(s), " "))
			}
		}
	}
	return nil
}

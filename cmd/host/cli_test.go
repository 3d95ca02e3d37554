package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
)

// result is one run of the host binary.
type result struct {
	stdout, stderr string
	code           int
}

func runHost(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		r.code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return r
}

// cliStores are two databases and two streams: the "default" ones the
// environment names (DATABASE_URL, USHER_STREAM) and the "named" ones the
// command line names. Each holds one dead letter of its own kind and its
// own number of stream entries, so every output says which was read.
type cliStores struct {
	defaultURL, namedURL       string
	defaultPool, namedPool     *pgxpool.Pool
	defaultStream, namedStream string
	namedLetter                int64
	env                        []string
}

func newCLIStores(t *testing.T) cliStores {
	t.Helper()
	ctx := context.Background()
	var s cliStores
	defaultPool, defaultURL := hosttest.DB(t)
	namedPool, namedURL := hosttest.DB(t)
	rdb, defaultStream := hosttest.Redis(t)
	_, namedStream := hosttest.Redis(t)
	s.defaultURL, s.namedURL, s.defaultStream, s.namedStream = defaultURL, namedURL, defaultStream, namedStream
	s.defaultPool, s.namedPool = defaultPool, namedPool
	for _, db := range []struct {
		pool *pgxpool.Pool
		kind string
	}{{defaultPool, "default_kind"}, {namedPool, "named_kind"}} {
		_, err := deadletter.Add(ctx, db.pool, deadletter.Letter{JobID: "7", Kind: db.kind, Payload: []byte(`{}`),
			Reason: "permanent failure: " + db.kind, Attempts: 1, StreamID: "1-0"})
		require.NoError(t, err)
	}
	require.NoError(t, namedPool.QueryRow(ctx, `SELECT id FROM dead_letters`).Scan(&s.namedLetter))
	for stream, n := range map[string]int{defaultStream: 1, namedStream: 3} {
		require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
		for range n {
			require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
		}
	}
	s.env = []string{"DATABASE_URL=" + defaultURL, "USHER_STREAM=" + defaultStream, "REDIS_URL=" + hosttest.RedisURL()}
	return s
}

// Every command form reads the database and stream its command line names,
// whether the flags come before or after the command, the subcommand and
// the arguments; the environment's only when none is named. An unknown or
// misplaced flag is exit status 2 and reads nothing.
func TestFlagsAnywhere(t *testing.T) {
	t.Parallel()
	s := newCLIStores(t)
	bin := hosttest.Build(t, "./cmd/host")
	db, stream := s.namedURL, s.namedStream
	id := strconv.FormatInt(s.namedLetter, 10)
	named := []string{"named_kind"}
	const inspectNamed = "(group usher)\n  entries           3\n"

	for _, tc := range []struct {
		args []string
		code int
		want []string // in stdout (code 0) or stderr
	}{
		{[]string{"inspect", "--database-url", db, "--stream", stream}, 0, append(named, inspectNamed)},
		{[]string{"--database-url", db, "inspect", "--stream", stream}, 0, append(named, inspectNamed)},
		{[]string{"--stream", stream, "--database-url", db, "inspect"}, 0, append(named, inspectNamed)},
		{[]string{"inspect", "--json", "--database-url=" + db, "--stream=" + stream}, 0, []string{`"kind": "named_kind"`, `"entries": 3`}},
		{[]string{"inspect"}, 0, []string{"default_kind", "(group usher)\n  entries           1\n"}},

		{[]string{"deadletters", "list", "--database-url", db}, 0, named},
		{[]string{"deadletters", "--database-url", db, "list"}, 0, named},
		{[]string{"--database-url", db, "deadletters", "list"}, 0, named},
		{[]string{"deadletters", "list", "--kind", "named_kind", "--database-url", db}, 0, named},
		{[]string{"deadletters", "--kind", "named_kind", "list", "--database-url", db}, 0, named},
		{[]string{"deadletters", "list", "--kind", "other", "--database-url", db}, 0, []string{"no open dead letters of kind other"}},
		{[]string{"deadletters", "list", "--json", "--database-url", db}, 0, []string{`"kind": "named_kind"`}},
		{[]string{"deadletters", "list"}, 0, []string{"default_kind"}},

		{[]string{"deadletters", "show", id, "--database-url", db}, 0, named},
		{[]string{"deadletters", "--database-url", db, "show", id}, 0, named},
		{[]string{"deadletters", "show", "--database-url", db, id, "--json"}, 0, []string{`"kind": "named_kind"`}},

		// Wrong command lines: exit 2, and nothing read.
		{[]string{"deadletters", "list", "--database-url", db, "--bogus"}, 2, []string{"deadletters list: unknown flag --bogus (run 'host deadletters list -h' for its flags)"}},
		{[]string{"deadletters", "--bogus", "list"}, 2, []string{"deadletters: unknown flag --bogus (run 'host deadletters -h' for its flags)"}},
		{[]string{"--bogus", "inspect"}, 2, []string{"unknown flag --bogus (run 'host -h' for its flags)"}},
		{[]string{"deadletters", "show", id, "--kind", "named_kind", "--database-url", db}, 2, []string{"deadletters show: unknown flag --kind"}},
		{[]string{"deadletters", "list", "--stream", stream, "--database-url", db}, 2, []string{"deadletters list: unknown flag --stream"}},
		{[]string{"deadletters", "list", "--database-url"}, 2, []string{"flag needs an argument: -database-url"}},
		{[]string{"deadletters", "list", "--limit", "x", "--database-url", db}, 2, []string{`invalid value "x" for flag -limit`}},
		{[]string{"deadletters", "list", "extra", "--database-url", db}, 2, []string{`deadletters list takes no arguments, got ["extra"]`}},
		{[]string{"deadletters", "requeue", id, "--kind", "named_kind", "--database-url", db}, 2, []string{"takes IDs or --kind, not both"}},
		{[]string{"deadletters", "requeue", "--database-url", db}, 2, []string{"deadletters requeue takes one or more dead letter IDs, or --kind KIND"}},
		{[]string{"deadletters", "requeue", "nope", "--database-url", db}, 2, []string{`"nope" is not a dead letter ID`}},
		{[]string{"deadletters", "--database-url", db}, 2, []string{"deadletters needs a command"}},
		{[]string{"deadletters", "frob", "--database-url", db}, 2, []string{`unknown command "deadletters frob"`}},
		{[]string{"frob"}, 2, []string{`unknown command "frob"`}},
		{nil, 2, []string{"needs a command"}},
		{[]string{"inspect", "extra"}, 2, []string{`inspect takes no arguments, got ["extra"]`}},
		{[]string{"migrate", "extra"}, 2, []string{`migrate takes no arguments, got ["extra"]`}},
		// The demo makes its own database and stream: it takes no flag naming one.
		{[]string{"demo", "--database-url", db}, 2, []string{"demo: unknown flag --database-url"}},
		{[]string{"demo", "--stream", stream}, 2, []string{"demo: unknown flag --stream"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := runHost(t, bin, s.env, tc.args...)
			require.Equal(t, tc.code, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
			out, other := r.stdout, "default_kind"
			if tc.code != 0 {
				out = r.stderr
				require.Empty(t, r.stdout, "a refused command line prints nothing on stdout")
			}
			if strings.Contains(strings.Join(tc.want, " "), "default_kind") {
				other = "named_kind"
			}
			for _, w := range tc.want {
				require.Contains(t, out, w)
			}
			require.NotContains(t, out, other, "read the other database")
		})
	}

	// Requeue acts on the named database only, whichever way it is
	// written: each form requeues one letter (ID stands for a fresh one's).
	for i, args := range [][]string{
		{"deadletters", "requeue", "--kind", "named_kind", "--database-url", db},
		{"deadletters", "--database-url", db, "--kind", "named_kind", "requeue"},
		{"--kind", "named_kind", "deadletters", "requeue", "--database-url", db},
		{"deadletters", "requeue", "ID", "--database-url", db},
		{"--database-url", db, "deadletters", "requeue", "ID"},
		{"deadletters", "--database-url", db, "requeue", "ID"},
	} {
		if i > 0 {
			_, err := deadletter.Add(context.Background(), s.namedPool, deadletter.Letter{JobID: "j" + strconv.Itoa(i), Kind: "named_kind",
				Payload: []byte(`{}`), Reason: "permanent failure", Attempts: 1, StreamID: strconv.Itoa(i) + "-1"})
			require.NoError(t, err)
		}
		var id int64
		require.NoError(t, s.namedPool.QueryRow(context.Background(), `SELECT max(id) FROM dead_letters`).Scan(&id))
		for j := range args {
			args[j] = strings.ReplaceAll(args[j], "ID", strconv.FormatInt(id, 10))
		}
		r := runHost(t, bin, s.env, args...)
		require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
		require.Equal(t, "requeued 1 dead letter(s) through the outbox, identities kept\n", r.stdout, "%v", args)
	}
	require.EqualValues(t, 0, hosttest.Count(t, s.namedPool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NULL`))
	require.EqualValues(t, 6, hosttest.Count(t, s.namedPool, `SELECT count(*) FROM outbox WHERE kind = 'named_kind'`), "each requeued once")
	require.EqualValues(t, 0, hosttest.Count(t, s.defaultPool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NOT NULL`))
}

// -h and --help print the command's usage on stdout and exit 0, for every
// command; an unknown flag exits 2 for every command, before it connects
// to anything.
func TestHelpAndUnknownFlags(t *testing.T) {
	t.Parallel()
	bin := hosttest.Build(t, "./cmd/host")
	var paths [][]string
	var walk func(prefix []string, c *command)
	walk = func(prefix []string, c *command) {
		paths = append(paths, prefix)
		for _, s := range c.subs {
			walk(append(prefix[:len(prefix):len(prefix)], s.name), s)
		}
	}
	walk(nil, (&cli{}).commands())
	require.Greater(t, len(paths), 12)
	for _, p := range paths {
		usage := strings.Join(append([]string{"usage: host"}, p...), " ")
		for _, help := range []string{"-h", "--help", "-help"} {
			for _, args := range [][]string{append(p[:len(p):len(p)], help), append([]string{help}, p...)} {
				if help != "-h" && args[0] == help {
					continue
				}
				r := runHost(t, bin, nil, args...)
				if args[0] == help && len(p) > 0 {
					// Before any command name, -h is the top level's.
					usage = "usage: host <command>"
				}
				require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
				require.Contains(t, r.stdout, usage, "%v", args)
				require.Empty(t, r.stderr, "%v", args)
				usage = strings.Join(append([]string{"usage: host"}, p...), " ")
			}
		}
		r := runHost(t, bin, []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}, append(p[:len(p):len(p)], "--no-such-flag")...)
		require.Equal(t, 2, r.code, "%v: %s", p, r.stderr)
		require.Contains(t, r.stderr, "unknown flag --no-such-flag", "%v", p)
		require.NotContains(t, r.stderr, "127.0.0.1:1", "refused before connecting")
	}

	// A malformed environment variable is refused the same way, never
	// replaced by the flag's default.
	for env, want := range map[string]string{
		"USHER_CONCURRENCY=lots":  `run: invalid value "lots" in USHER_CONCURRENCY (the default of --concurrency)`,
		"USHER_JOB_TIMEOUT=never": `run: invalid value "never" in USHER_JOB_TIMEOUT (the default of --job-timeout)`,
	} {
		r := runHost(t, bin, []string{env}, "run", "--admin-addr", "")
		require.Equal(t, 2, r.code, "%s: %s", env, r.stderr)
		require.Contains(t, r.stderr, want)
	}
	r := runHost(t, bin, []string{"USHER_CONCURRENCY=lots"}, "run", "-h")
	require.Equal(t, 0, r.code, "-h needs no valid environment: %s", r.stderr)
	require.Contains(t, r.stdout, "  --concurrency int\n    \tjobs in flight (USHER_CONCURRENCY) (default 16)\n")
}

// A database without usher's tables is named in the error, with what to
// check, instead of Postgres's bare "relation does not exist".
func TestWrongDatabaseIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, hosttest.DatabaseURL())
	require.NoError(t, err)
	db := "usher_t_" + hosttest.Suffix()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+db)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	empty := strings.Replace(hosttest.DatabaseURL(), "/test?", "/"+db+"?", 1)
	_, stream := hosttest.Redis(t)
	bin := hosttest.Build(t, "./cmd/host")
	for _, args := range [][]string{
		{"inspect", "--database-url", empty, "--stream", stream},
		{"deadletters", "list", "--database-url", empty},
	} {
		r := runHost(t, bin, []string{"REDIS_URL=" + hosttest.RedisURL()}, args...)
		require.Equal(t, 1, r.code, "%v: %s", args, r.stdout)
		require.Contains(t, r.stderr, "/"+db+"?sslmode=disable has no usher tables (relation \"", args)
		require.Contains(t, r.stderr, "is --database-url (DATABASE_URL) right? A new database needs `host migrate`; the demo prints the flags that read its own", args)
	}
}

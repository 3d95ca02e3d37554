package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
)

// The admin API's commands in the README, run as written by sh, as an
// operator whose home holds the host's default token file. One change:
// the default address 127.0.0.1:9464 is the test host's (USHER_ADMIN_ADDR
// for bin/host, substituted in the curl lines), as tests never take 9464.
func TestREADMEAdminCommands(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	h, _, o := runningHost(t, home)
	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "bin"), 0o755))
	require.NoError(t, os.Symlink(o.bin, filepath.Join(work, "bin", "host")))

	lines := doctest.Block(t, "docs/operating.md", "**The admin API.**", "sh")
	require.Len(t, lines, 5)
	want := []string{"counters  1.0.0", "counters  1.0.0", "counters: unchanged (1.0.0)", "ok", "usher_"}
	for i, line := range lines {
		cmdline, _, _ := strings.Cut(line, "  #") // the comment is the README's, not the shell's concern
		cmdline = strings.ReplaceAll(cmdline, "127.0.0.1:9464", h.AdminAddr())
		cmd := o.cmd("sh", "-c", cmdline)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", line, out)
		require.Contains(t, string(out), want[i], line)
	}

	// The Operating section's plugins list and reload lines, every optional
	// part left out and put in.
	ran := 0
	for _, line := range doctest.Block(t, "docs/operating.md", "## The commands", "text") {
		if !strings.HasPrefix(line, "bin/host plugins [list]") && !strings.HasPrefix(line, "bin/host plugins reload") {
			continue
		}
		for _, l := range expand(line) {
			l = strings.ReplaceAll(l, " NAME", " counters")
			cmdline, _, _ := strings.Cut(l, "  #")
			cmd := o.cmd("sh", "-c", cmdline)
			cmd.Dir = work
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s: %s", l, out)
			require.Contains(t, string(out), "counters", l)
			ran++
		}
	}
	require.Equal(t, 6, ran, "plugins, plugins list, each with and without --json; reload, reload counters")

	// The same commands without the token fail.
	nobody := o
	nobody.home = t.TempDir()
	cmd := nobody.cmd("sh", "-c", strings.ReplaceAll(lines[4], "127.0.0.1:9464", h.AdminAddr()))
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "401")

	// The Prometheus scrape config authenticates with a credentials file
	// and scrapes the default address.
	yaml := strings.Join(doctest.Block(t, "docs/operating.md", "**The admin API.**", "yaml"), "\n")
	require.Contains(t, yaml, "authorization:\n      credentials_file: ")
	require.Contains(t, yaml, `targets: ["127.0.0.1:9464"]`)
}

// expand returns line with each "[...]" left out and put in, every
// combination, the shortest first.
func expand(line string) []string {
	i := strings.Index(line, " [")
	if i < 0 {
		return []string{line}
	}
	j := strings.Index(line[i:], "]") + i
	var out []string
	for _, rest := range expand(line[j+1:]) {
		out = append(out, line[:i]+rest, line[:i]+" "+line[i+2:j]+rest)
	}
	return out
}

// readmeShell runs line with sh in dir, where bin/host is the host binary,
// with env, and returns its output; a non-zero exit fails the test.
func readmeShell(t *testing.T, dir string, env []string, line string) string {
	t.Helper()
	cmdline, _, _ := strings.Cut(line, "  #")
	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s: %s", cmdline, out)
	return string(out)
}

// binDir returns a directory holding bin/host, the host binary.
func binDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/host"), filepath.Join(dir, "bin", "host")))
	return dir
}

// The Operating section's database commands, as written, every optional
// part left out and put in: K is a kind with open dead letters, ID the
// oldest open one's; the database and stream come from DATABASE_URL and
// USHER_STREAM. Then the "flags go anywhere" pair, on the database they
// name (the test's in place of the README's).
func TestREADMEOperatingCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	const kind = "update_sales_counter"
	for i := range 6 {
		_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: strconv.Itoa(i), Kind: kind, Payload: []byte(`{}`),
			Reason: "permanent failure: order " + strconv.Itoa(i), Attempts: 1, StreamID: strconv.Itoa(i) + "-0"})
		require.NoError(t, err)
	}
	dir := binDir(t)
	env := []string{"DATABASE_URL=" + dbURL, "USHER_STREAM=" + stream, "REDIS_URL=" + hosttest.RedisURL()}

	ran := 0
	for _, line := range doctest.Block(t, "docs/operating.md", "## The commands", "text") {
		if !strings.HasPrefix(line, "bin/host migrate") && !strings.HasPrefix(line, "bin/host inspect") &&
			!strings.HasPrefix(line, "bin/host deadletters") {
			continue
		}
		for _, l := range expand(line) {
			var id string
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(min(id), 0)::text FROM dead_letters WHERE requeued_at IS NULL AND discarded_at IS NULL`).Scan(&id))
			l = strings.ReplaceAll(strings.ReplaceAll(l, " ID", " "+id), " K", " "+kind)
			out := readmeShell(t, dir, env, l)
			switch {
			case strings.Contains(l, "requeue"):
				require.Contains(t, out, "requeued ", l)
			case strings.Contains(l, "discard"):
				require.Contains(t, out, "discarded dead letter "+id, l)
			case strings.Contains(l, "--json"):
				require.True(t, json.Valid([]byte(out)), "%s: %s", l, out)
				require.Contains(t, out, kind, l)
			case strings.Contains(l, "inspect"), strings.Contains(l, "deadletters"):
				require.Contains(t, out, kind, l)
			}
			ran++
		}
	}
	require.Equal(t, 15, ran, "migrate ×2, inspect ×2, list ×4, show ×2, discard ×2, requeue IDs ×2, requeue --kind")
	require.EqualValues(t, 0, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NULL AND discarded_at IS NULL`))
	require.EqualValues(t, 2, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE discarded_at IS NOT NULL`))

	_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: "9", Kind: kind, Payload: []byte(`{}`), Reason: "permanent failure: order 9", Attempts: 1, StreamID: "9-0"})
	require.NoError(t, err)
	ours := strings.TrimSuffix(dbURL, "?sslmode=disable")
	lines := doctest.Block(t, "docs/operating.md", "**Flags go anywhere**", "sh")
	require.Len(t, lines, 2)
	var outs []string
	for _, line := range lines {
		require.Contains(t, line, "postgres://usher@127.0.0.1:5432/stagedoor")
		line = strings.ReplaceAll(line, "postgres://usher@127.0.0.1:5432/stagedoor", ours)
		outs = append(outs, readmeShell(t, dir, []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}, line))
	}
	require.Contains(t, outs[0], "permanent failure: order 9")
	// The same output but for the AGE column, which may tick over a
	// second between the two commands (and so change the column's width).
	age := regexp.MustCompile(`\s\d[\d.]*(µs|ms|s|m\d\ds|h\d\dm|d\d+h)\s`)
	spaces := regexp.MustCompile(` +`)
	same := func(s string) string { return spaces.ReplaceAllString(age.ReplaceAllString(s, " AGE "), " ") }
	require.Equal(t, same(outs[0]), same(outs[1]))
}

// The commands the demo prints to read its state are the README's, and
// they read the database and stream they name (the test's in place of the
// demo's).
func TestREADMEDemoCommands(t *testing.T) {
	t.Parallel()
	demoURL, err := demoDatabaseURL(demoAdminURL, true)
	require.NoError(t, err)
	lines := doctest.Block(t, "README.md", "ends by printing the commands that read them:", "sh")
	require.Equal(t, inspectCommands(demoURL, demoStream), lines)

	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	_, err = deadletter.Add(ctx, pool, deadletter.Letter{JobID: "1", Kind: "send_tickets", Payload: []byte(`{}`), Reason: "permanent failure: demo", Attempts: 1, StreamID: "1-0"})
	require.NoError(t, err)
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
	dir := binDir(t)
	env := []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none", "USHER_STREAM=nothing", "REDIS_URL=" + hosttest.RedisURL()}
	for _, line := range lines {
		line = strings.ReplaceAll(strings.ReplaceAll(line, demoURL, dbURL), demoStream, stream)
		out := readmeShell(t, dir, env, line)
		require.Contains(t, out, "send_tickets", line)
		if strings.Contains(line, "inspect") {
			require.Contains(t, out, "  pending           0\n", line)
		}
	}
}

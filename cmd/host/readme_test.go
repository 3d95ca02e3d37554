package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// readmeBlock returns the lines of the first fenced block of lang that
// follows marker in the README.
func readmeBlock(t *testing.T, marker, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(hosttest.ModuleRoot(t), "README.md"))
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(b), marker)
	require.True(t, ok, "README has no %q", marker)
	_, after, ok = strings.Cut(after, "```"+lang+"\n")
	require.True(t, ok, "no %s block after %q", lang, marker)
	block, _, ok := strings.Cut(after, "```")
	require.True(t, ok)
	return strings.Split(strings.TrimSpace(block), "\n")
}

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

	lines := readmeBlock(t, "**The admin API.**", "sh")
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

	// The same commands without the token fail.
	nobody := o
	nobody.home = t.TempDir()
	cmd := nobody.cmd("sh", "-c", strings.ReplaceAll(lines[4], "127.0.0.1:9464", h.AdminAddr()))
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "401")

	// The Prometheus scrape config authenticates with a credentials file
	// and scrapes the default address.
	yaml := strings.Join(readmeBlock(t, "**The admin API.**", "yaml"), "\n")
	require.Contains(t, yaml, "authorization:\n      credentials_file: ")
	require.Contains(t, yaml, `targets: ["127.0.0.1:9464"]`)
}

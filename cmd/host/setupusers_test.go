package main

import (
	"os"
	"os/exec"
	"os/user"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/doctest"
)

// The README's plugin users commands: setup-users creates a system user
// per plugin, with a group of its own, no home and no login shell, and is
// safe to run again; run names them by the same pattern. The test's users
// have a prefix of their own (the README's usher-p- could be a real
// deployment's on this machine) and are deleted at the end.
func TestREADMEPluginUsers(t *testing.T) {
	t.Parallel()
	require.Zero(t, os.Geteuid(), "the tests run as root, to create users")
	lines := doctest.Block(t, "docs/security.md", "`host setup-users` creates", "sh")
	require.Len(t, lines, 2)
	require.Equal(t, "bin/host setup-users --plugin counters --plugin tickets", lines[0])
	require.Contains(t, lines[1], "--plugin-user '"+pluginhost.DefaultUserPattern+"'", "run names the users setup-users creates")
	pattern := "ut" + hosttest.Suffix()[:8] + "-{name}"
	for _, p := range []string{"counters", "tickets"} {
		name := pluginhost.UserFor(pattern, p)
		t.Cleanup(func() { require.NoError(t, pluginhost.UserDel(name)) })
	}
	dir := binDir(t)
	line := lines[0] + " --plugin-user '" + pattern + "'"
	out := readmeShell(t, dir, nil, line)
	for _, p := range []string{"counters", "tickets"} {
		name := pluginhost.UserFor(pattern, p)
		require.Contains(t, out, "plugin "+p+": OS user "+name+" (created)")
		u, err := user.Lookup(name)
		require.NoError(t, err)
		require.NotEqual(t, "0", u.Uid)
		g, err := user.LookupGroupId(u.Gid)
		require.NoError(t, err)
		require.Equal(t, name, g.Name, "a group of its own")
		ent, err := exec.Command("getent", "passwd", name).Output()
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(strings.TrimSpace(string(ent)), ":/nonexistent:/usr/sbin/nologin"), "%s", ent)
	}
	require.Contains(t, readmeShell(t, dir, nil, line), "(exists)", "safe to run again")
	// One user for every plugin is refused: they could kill each other.
	r := runHost(t, hosttest.Build(t, "./cmd/host"), nil, "setup-users", "--plugin", "a", "--plugin-user", "nobody")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "could signal each other")
}

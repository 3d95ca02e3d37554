package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/doctest"
)

// `host plugins init` writes a module that builds, vets and passes its own
// sdktest tests against this tree's usher (a replace directive), and whose
// Makefile deploys each version's binary and migrations under versioned
// names and replaces the manifest atomically; it refuses a bad name, a bad
// module path, a non-empty directory and a flag of another command.
func TestPluginsInit(t *testing.T) {
	t.Parallel()
	bin := hosttest.Build(t, "./cmd/host")
	root := hosttest.ModuleRoot(t)
	dir := filepath.Join(t.TempDir(), "tplinit")

	r := runHost(t, bin, nil, "plugins", "init", "tplinit", "--dir", dir, "--module", "example.org/acme/tplinit")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "wrote plugin tplinit (module example.org/acme/tplinit) to "+dir)
	for _, f := range []string{"go.mod", "main.go", "render.go", "notify.go", "count.go", "plugin_test.go",
		"migrations/00001_tables.sql", "grants.json", "Makefile", "README.md"} {
		require.FileExists(t, filepath.Join(dir, f))
	}
	var grants []any
	b, err := os.ReadFile(filepath.Join(dir, "grants.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &grants))
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(mod), "module example.org/acme/tplinit\n")
	require.Contains(t, string(mod), "require github.com/usherhq/usher ")

	// This tree's usher in place of a published one, with this tree's
	// requirements and checksums, so no module is fetched.
	gocmd(t, dir, "mod", "edit", "-replace", "github.com/usherhq/usher="+root)
	var usherMod struct {
		Require []struct{ Path, Version string }
	}
	require.NoError(t, json.Unmarshal(gocmd(t, root, "mod", "edit", "-json"), &usherMod))
	for _, req := range usherMod.Require {
		gocmd(t, dir, "mod", "edit", "-require", req.Path+"@"+req.Version)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))

	unformatted, err := exec.Command("gofmt", "-l", dir).CombinedOutput()
	require.NoError(t, err, "%s", unformatted)
	require.Empty(t, strings.TrimSpace(string(unformatted)), "gofmt")
	gocmd(t, dir, "vet", "./...")
	out := gocmd(t, dir, "test", "-count=1", "-v", "./...")
	for _, test := range []string{"TestRenderIsIdempotent", "TestNotifyIsIdempotent", "TestCountIsIdempotent"} {
		require.Contains(t, string(out), "--- PASS: "+test+" ", "%s", out)
	}
	require.Contains(t, string(out), "crashes_after_the_effect,_before_the_mark", "every scenario ran")
	require.Contains(t, string(out), "--- PASS: TestCountIsIdempotent/when_another_job_on_the_same_rows_runs_at_once", "the race ran")

	// The Makefile builds the binary under a versioned name and writes its
	// manifest, with its migrations beside it, also versioned.
	makeIn := func(args ...string) {
		t.Helper()
		make := exec.Command("make", append(args, "HOST="+bin, "GOFLAGS=-mod=mod")...)
		make.Dir = dir
		make.Env = append(os.Environ(), "GOPROXY=off")
		mout, err := make.CombinedOutput()
		require.NoError(t, err, "make %v: %s", args, mout)
	}
	dist := filepath.Join(dir, "dist")
	manifest := filepath.Join(dist, "tplinit.plugin.json")
	makeIn("manifest", "VERSION=0.2.0")
	m, err := pluginhost.ReadManifest(manifest)
	require.NoError(t, err)
	require.Equal(t, "0.2.0", m.Version)
	require.ElementsMatch(t, []string{"tplinit_render", "tplinit_notify", "tplinit_count"}, m.Kinds)
	require.Equal(t, "tplinit-0.2.0", m.Binary)
	binSum, err := pluginhost.FileSHA256(filepath.Join(dist, "tplinit-0.2.0"))
	require.NoError(t, err)
	require.Equal(t, binSum, m.SHA256)
	require.NoFileExists(t, filepath.Join(dist, "tplinit"), "no unversioned binary to rename over")
	require.DirExists(t, filepath.Join(dist, "tplinit-0.2.0-migrations"))
	require.Equal(t, "tplinit-0.2.0-migrations", m.Migrations)
	require.NotEmpty(t, m.MigrationsSHA256)

	// The next version is deployed beside it: 0.2.0's binary is not
	// touched (a host may still restart it), and the manifest is replaced
	// by a rename, not written in place: a reader that opened 0.2.0's
	// manifest reads all of it, and the path names another file.
	before, err := os.Stat(manifest)
	require.NoError(t, err)
	open, err := os.Open(manifest)
	require.NoError(t, err)
	defer open.Close()
	makeIn("manifest", "VERSION=0.3.0")
	m3, err := pluginhost.ReadManifest(manifest)
	require.NoError(t, err)
	require.Equal(t, "0.3.0", m3.Version)
	require.Equal(t, "tplinit-0.3.0", m3.Binary)
	require.Equal(t, "tplinit-0.3.0-migrations", m3.Migrations)
	after, err := os.Stat(manifest)
	require.NoError(t, err)
	require.False(t, os.SameFile(before, after), "the manifest was written in place, not replaced by a rename")
	old, err := io.ReadAll(open)
	require.NoError(t, err)
	require.Contains(t, string(old), `"version": "0.2.0"`)
	require.True(t, json.Valid(old), "the old manifest, whole: %s", old)
	still, err := pluginhost.FileSHA256(filepath.Join(dist, "tplinit-0.2.0"))
	require.NoError(t, err)
	require.Equal(t, m.SHA256, still, "0.2.0's binary changed under a host that runs it")
	entries, err := os.ReadDir(dist)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasPrefix(e.Name(), "."), "a temporary file left behind: %s", e.Name())
	}
	scan, err := pluginhost.ScanDir(dist)
	require.NoError(t, err)
	require.Len(t, scan.Plugins, 1)
	require.Equal(t, "0.3.0", scan.Plugins[0].Manifest.Version)

	// make prune removes the version the manifest no longer names.
	makeIn("prune")
	require.NoFileExists(t, filepath.Join(dist, "tplinit-0.2.0"))
	require.NoDirExists(t, filepath.Join(dist, "tplinit-0.2.0-migrations"))
	require.FileExists(t, filepath.Join(dist, "tplinit-0.3.0"))
	require.DirExists(t, filepath.Join(dist, "tplinit-0.3.0-migrations"))
	scan, err = pluginhost.ScanDir(dist)
	require.NoError(t, err)
	require.Empty(t, scan.Problems, "no executable is left that no manifest names")

	// Refusals: exit status 2 for a command line init does not take, 1 for
	// a directory it will not write to; nothing is written either way.
	empty := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"plugins", "init", "Shop", "--dir", empty}, 2, `plugin name "Shop" is refused`},
		{[]string{"plugins", "init", "9lives", "--dir", empty}, 2, `plugin name "9lives" is refused`},
		{[]string{"plugins", "init", "shop-x", "--dir", empty}, 2, `plugin name "shop-x" is refused`},
		{[]string{"plugins", "init", "--dir", empty}, 2, "usage: host plugins init NAME"},
		{[]string{"plugins", "init", "a", "b", "--dir", empty}, 2, "usage: host plugins init NAME"},
		{[]string{"plugins", "init", "shop", "--dir", empty, "--module", "example.com/my shop"}, 2, `module path "example.com/my shop" is refused`},
		{[]string{"plugins", "init", "shop", "--dir", empty, "--module", "/abs"}, 2, `module path "/abs" is refused`},
		{[]string{"plugins", "init", "shop", "--dir", dir}, 1, dir + " exists and is not empty"},
		// A flag of another command is an error, not ignored.
		{[]string{"plugins", "init", "shop", "--dir", empty, "--kind", "shop_x"}, 2, "plugins init: unknown flag --kind"},
		{[]string{"plugins", "manifest", "--dir", empty, "x"}, 2, "plugins manifest: unknown flag --dir"},
		{[]string{"plugins", "list", "--module", "example.com/x"}, 2, "plugins list: unknown flag --module"},
		{[]string{"plugins", "init", "shop", "--dir"}, 2, "flag needs an argument"},
	} {
		r := runHost(t, bin, nil, c.args...)
		require.Equal(t, c.code, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, "%v", c.args)
	}
	left, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, left, "a refused init writes nothing")

	// An existing empty directory is fine.
	r = runHost(t, bin, nil, "plugins", "init", "shop", "--dir", empty)
	require.Equal(t, 0, r.code, r.stderr)
	mod, err = os.ReadFile(filepath.Join(empty, "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(mod), "module example.com/shop\n")

	// docs/plugins.md's init line, as written (its next line, go mod tidy
	// and make test, is what ran above, offline); the README's tour shows
	// the same two lines.
	lines := doctest.Block(t, "docs/plugins.md", "## Write a plugin", "sh")
	require.Len(t, lines, 2)
	require.Equal(t, lines, doctest.Block(t, "README.md", "**Write a plugin.**", "sh"), "the README's tour and docs/plugins.md")
	work := binDir(t)
	readmeShell(t, work, nil, lines[0])
	mod, err = os.ReadFile(filepath.Join(work, "shop", "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(mod), "module example.com/shop\n")
}

// gocmd runs the go command in dir with no module fetched, and returns
// its output.
func gocmd(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %v: %s", args, out)
	return out
}

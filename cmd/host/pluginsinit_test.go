package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
)

// `host plugins init` writes a module that builds, vets and passes its own
// sdktest tests against this tree's usher (a replace directive), and whose
// Makefile writes the plugin's manifest; it refuses a bad name, a bad
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

	// The Makefile builds the binary and writes its manifest, with its
	// migrations beside it.
	make := exec.Command("make", "manifest", "HOST="+bin, "VERSION=0.2.0", "GOFLAGS=-mod=mod")
	make.Dir = dir
	make.Env = append(os.Environ(), "GOPROXY=off")
	mout, err := make.CombinedOutput()
	require.NoError(t, err, "%s", mout)
	m, err := pluginhost.ReadManifest(filepath.Join(dir, "dist", "tplinit.plugin.json"))
	require.NoError(t, err)
	require.Equal(t, "0.2.0", m.Version)
	require.ElementsMatch(t, []string{"tplinit_render", "tplinit_notify", "tplinit_count"}, m.Kinds)
	require.DirExists(t, filepath.Join(dir, "dist", "tplinit-migrations"))
	require.Equal(t, "tplinit-migrations", m.Migrations)
	require.NotEmpty(t, m.MigrationsSHA256)

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

	// The README's init line, as written (its next line, go mod tidy and
	// make test, is what ran above, offline).
	lines := readmeBlock(t, "### Write a plugin", "sh")
	require.Len(t, lines, 2)
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

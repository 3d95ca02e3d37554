package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/doctest"
)

// `host plugins init` writes a module whose go.mod replaces usher with
// the checkout --usher-dir names (or, for this host built from source, the
// one above its executable), declares usher-vet as a tool, and resolves
// with go mod tidy; whose Makefile deploys each version's binary and
// migrations under versioned names with the host USHER_HOST names and
// replaces the manifest atomically; it refuses a bad name, a bad module
// path, a --usher-dir that is not usher's, a non-empty directory and a
// flag of another command. TestREADMEWriteAPlugin runs the module's tests.
func TestPluginsInit(t *testing.T) {
	t.Parallel()
	bin := hosttest.Build(t, "./cmd/host")
	root := hosttest.ModuleRoot(t)
	dir := filepath.Join(t.TempDir(), "tplinit")

	r := runHost(t, bin, nil, "plugins", "init", "tplinit", "--dir", dir, "--module", "example.org/acme/tplinit", "--usher-dir", root)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "wrote plugin tplinit (module example.org/acme/tplinit) to "+dir)
	require.Contains(t, r.stdout, "its go.mod replaces github.com/usherhq/usher with the checkout "+root)
	for _, f := range []string{"go.mod", "main.go", "render.go", "notify.go", "count.go", "plugin_test.go",
		"migrations/00001_tables.sql", "grants.json", "Makefile", "README.md"} {
		require.FileExists(t, filepath.Join(dir, f))
	}
	var grants []any
	b, err := os.ReadFile(filepath.Join(dir, "grants.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &grants))
	mod := readGoMod(t, dir)
	require.Equal(t, "example.org/acme/tplinit", mod.Module.Mod.Path)
	require.Equal(t, root, mod.Replace[0].New.Path)
	require.Equal(t, "github.com/usherhq/usher", mod.Replace[0].Old.Path)
	require.Equal(t, "github.com/usherhq/usher/cmd/usher-vet", mod.Tool[0].Path)

	// It resolves as a user's would: the module proxy and cache of this
	// machine, usher from the checkout.
	gocmd(t, dir, "mod", "tidy")
	unformatted, err := exec.Command("gofmt", "-l", dir).CombinedOutput()
	require.NoError(t, err, "%s", unformatted)
	require.Empty(t, strings.TrimSpace(string(unformatted)), "gofmt")

	// The Makefile builds the binary under a versioned name and writes its
	// manifest, with its migrations beside it, also versioned.
	makeIn := func(args ...string) {
		t.Helper()
		make := exec.Command("make", append(args, "USHER_HOST="+bin)...)
		make.Dir = dir
		mout, err := make.CombinedOutput()
		require.NoError(t, err, "make %v: %s", args, mout)
	}
	noHost := exec.Command("make", "manifest", "USHER_HOST="+filepath.Join(dir, "nohost"))
	noHost.Dir = dir
	out, err := noHost.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "make manifest: no usher host binary at "+filepath.Join(dir, "nohost"))
	require.NoDirExists(t, filepath.Join(dir, "dist"), "checked before anything is built")
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
	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "go.mod"), []byte("module example.com/other\n\ngo 1.26\n"), 0o644))
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
		{[]string{"plugins", "init", "shop", "--dir", empty, "--usher-dir", filepath.Join(empty, "none")}, 2,
			"--usher-dir " + filepath.Join(empty, "none") + " is not a source checkout of usher"},
		{[]string{"plugins", "init", "shop", "--dir", empty, "--usher-dir", other}, 2,
			"--usher-dir " + other + ` is not a source checkout of usher: its go.mod declares module "example.com/other"`},
		{[]string{"plugins", "init", "shop", "--dir", empty, "--usher-dir", dir}, 2,
			"--usher-dir " + dir + ` is not a source checkout of usher: its go.mod declares module "example.org/acme/tplinit"`},
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

	// An existing empty directory is fine. This host, built in this
	// checkout (bin/test), finds it above its executable.
	r = runHost(t, bin, nil, "plugins", "init", "shop", "--dir", empty)
	require.Equal(t, 0, r.code, r.stderr)
	mod = readGoMod(t, empty)
	require.Equal(t, "example.com/shop", mod.Module.Mod.Path)
	require.Equal(t, root, mod.Replace[0].New.Path)

	// A host built from source that finds no checkout, above a copy of
	// its executable or the working directory, says so, and what to do.
	away := t.TempDir()
	lone := filepath.Join(away, "host")
	b, err = os.ReadFile(bin)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(lone, b, 0o755))
	cmd := exec.Command(lone, "plugins", "init", "shop")
	cmd.Dir = away
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "found no usher checkout above its executable or the working directory")
	require.Contains(t, string(out), "--usher-dir /path/to/usher")
	mod = readGoMod(t, filepath.Join(away, "shop"))
	require.Empty(t, mod.Replace)
	require.Equal(t, zeroVersion, mod.Require[0].Mod.Version)

	// docs/plugins.md's init line, as written, with bin/host a link to
	// this checkout's build (its next line is TestREADMEWriteAPlugin's);
	// the README's tour shows the same two lines.
	lines := doctest.Block(t, "docs/plugins.md", "## Write a plugin", "sh")
	require.Len(t, lines, 2)
	require.Equal(t, lines, doctest.Block(t, "README.md", "**Write a plugin.**", "sh"), "the README's tour and docs/plugins.md")
	work := binDir(t)
	readmeShell(t, work, nil, lines[0])
	mod = readGoMod(t, filepath.Join(work, "shop"))
	require.Equal(t, "example.com/shop", mod.Module.Mod.Path)
	require.Equal(t, root, mod.Replace[0].New.Path)
}

// readGoMod parses dir's go.mod.
func readGoMod(t *testing.T, dir string) *modfile.File {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	f, err := modfile.Parse("go.mod", b, nil)
	require.NoError(t, err)
	return f
}

// A host's version decides what a new module requires: a released one
// its own version; a build in a checkout, "(devel)" or a version derived
// from its commit, none (it replaces usher with the checkout).
func TestReleasedVersion(t *testing.T) {
	t.Parallel()
	build := func(version string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/usherhq/usher", Version: version}, Settings: settings}
	}
	for _, c := range []struct {
		bi       *debug.BuildInfo
		version  string
		released bool
	}{
		{build("v1.2.0"), "v1.2.0", true},
		{build("(devel)"), "", false},
		{build("v0.0.0-20260101120000-4b29b88abcde+dirty", debug.BuildSetting{Key: "vcs.revision", Value: "4b29b88abcde"}), "", false},
		{build("v1.2.0", debug.BuildSetting{Key: "vcs.revision", Value: "4b29b88abcde"}), "", false},
		{&debug.BuildInfo{Main: debug.Module{Path: "example.com/fork", Version: "v1.2.0"}}, "", false},
	} {
		v, ok := releasedVersionOf(c.bi)
		require.Equal(t, c.released, ok, "%+v", c.bi.Main)
		require.Equal(t, c.version, v, "%+v", c.bi.Main)
	}
}

// gocmd runs the go command in dir, in the environment of the test, and
// returns its output.
func gocmd(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %v: %s", args, out)
	return out
}

// The README's "Write a plugin" lines, run as written by sh from a
// directory whose bin/host links to a host built from this checkout (as
// make build builds it), in the test's own environment (this machine's
// module proxy and cache; no GOFLAGS or GOPROXY of the test's), the test's
// Postgres in place of the README's: init finds this checkout above the
// host's executable and replaces usher with it, go mod tidy resolves, and
// make test vets (go vet, usher-vet) and passes the new plugin's sdktest
// tests. Then docs/plugins.md's "Vet your plugin" lines, as written, in
// that module: they pass; they report a mistake; and without the module's
// tool line they fail, as make vet does. The module is written outside
// the checkout, which the test leaves as it was; and usher's packages are
// this checkout's, compiled once for every test (a copy of the checkout
// elsewhere would compile them all again: the build cache keys a package
// by its directory).
func TestREADMEWriteAPlugin(t *testing.T) {
	t.Parallel()
	checkout := hosttest.ModuleRoot(t)
	work := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(work, "bin"), 0o755))
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/host"), filepath.Join(work, "bin", "host")))

	lines := doctest.Block(t, "README.md", "**Write a plugin.**", "sh")
	require.Len(t, lines, 2)
	const readmeURL = "'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'"
	require.Contains(t, lines[1], readmeURL)
	shell := func(dir, line string) (string, error) {
		t.Helper()
		cmdline, _, _ := strings.Cut(line, "  #")
		cmd := exec.Command("sh", "-c", cmdline)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out1, err := shell(work, lines[0])
	require.NoError(t, err, "%s: %s", lines[0], out1)
	require.Contains(t, out1, "its go.mod replaces github.com/usherhq/usher with the checkout "+checkout)
	shop := filepath.Join(work, "shop")
	require.Equal(t, checkout, readGoMod(t, shop).Replace[0].New.Path)
	out2, err := shell(work, strings.Replace(lines[1], readmeURL, "'"+hosttest.DatabaseURL()+"'", 1))
	require.NoError(t, err, "%s: %s", lines[1], out2)
	require.Contains(t, out2, "go tool usher-vet ./...", "make test vets with usher-vet")
	require.Regexp(t, `(?m)^ok  \texample\.com/shop\t`, out2)

	vet := doctest.Block(t, "docs/plugins.md", "## Vet your plugin", "sh")
	require.Len(t, vet, 2)
	for _, line := range vet {
		out, err := shell(shop, line)
		require.NoError(t, err, "%s: %s", line, out)
	}
	require.Len(t, readGoMod(t, shop).Tool, 1, "the first line adds nothing to a module that has the tool")

	// A mistake is reported, and fails the line.
	mistake := filepath.Join(shop, "mistake.go")
	require.NoError(t, os.WriteFile(mistake, []byte("package main\n\nimport \"github.com/usherhq/usher/sdk\"\n\nvar _ = sdk.KeyForTest(\"order-1\")\n"), 0o644))
	reported, err := shell(shop, vet[1])
	require.Error(t, err, "%s", reported)
	require.Contains(t, reported, "sdk.KeyForTest outside a _test.go file")
	require.NoError(t, os.Remove(mistake))

	// Without the tool line, go tool fails and says why; make vet too,
	// with what to run (go vet -vettool=$(go tool -n usher-vet) would run
	// the plain vet and pass).
	gocmd(t, shop, "mod", "edit", "-droptool", "github.com/usherhq/usher/cmd/usher-vet")
	out3, err := shell(shop, vet[1])
	require.Error(t, err, "%s", out3)
	require.Contains(t, out3, `no such tool "usher-vet"`)
	mk := exec.Command("make", "vet")
	mk.Dir = shop
	out, err := mk.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "make vet: usher-vet is not a tool of this module: go mod edit -tool github.com/usherhq/usher/cmd/usher-vet && go mod tidy")

	// make test without its database URL stops before anything runs.
	mk = exec.Command("make", "test")
	mk.Dir = shop
	mk.Env = withoutEnv(os.Environ(), "USHER_TEST_DATABASE_URL")
	out, err = mk.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "make test: USHER_TEST_DATABASE_URL is not set")
	require.NotContains(t, string(out), "go vet")
}

// withoutEnv is env without name.
func withoutEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// Package plugins_test holds what every shipped plugin must satisfy.
package plugins_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
)

const (
	module = "github.com/usherhq/usher"
	faults = module + "/plugins/stagedoor/faults"
)

// shipped are the plugin binaries usher ships; chaos are their builds for
// the demo, the chaos suite and the tests.
var (
	shipped = []string{"./counters", "./tickets", "./checkout"}
	chaos   = []string{"./counters/chaos", "./tickets/chaos", "./checkout/chaos"}
)

type pkg struct {
	path, dir string
	files     []string
}

// deps lists the module's packages main depends on (itself included), with
// their non-test Go files.
func deps(t *testing.T, main string) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps",
		"-f", `{{if not .Standard}}{{.ImportPath}}|{{.Dir}}|{{join .GoFiles ","}},{{join .CgoFiles ","}}{{end}}`, main).CombinedOutput()
	require.NoError(t, err, "go list -deps %s: %s", main, out)
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 || (f[0] != module && !strings.HasPrefix(f[0], module+"/")) {
			continue
		}
		p := pkg{path: f[0], dir: f[1]}
		for _, name := range strings.Split(f[2], ",") {
			if name != "" {
				p.files = append(p.files, name)
			}
		}
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs, "go list -deps %s found none of the module's packages", main)
	return pkgs
}

// The shipped plugins read like the reference text's handlers and nothing
// else: no fault-injection hook, no test-only write, no fault directory.
// Faults and the counter_applies recorder come from outside, in the chaos
// builds (plugins/*/chaos), which must depend on faults, or this test
// would prove nothing about where the faults went.
func TestShippedPluginsCarryNoFaultsOrTestWrites(t *testing.T) {
	t.Parallel()
	for _, main := range shipped {
		for _, p := range deps(t, main) {
			require.NotEqual(t, faults, p.path, "%s depends on the faults package", main)
			for _, name := range p.files {
				src, err := os.ReadFile(filepath.Join(p.dir, name))
				require.NoError(t, err)
				for _, banned := range []string{"counter_applies", "USHER_FAULT_DIR"} {
					require.NotContains(t, string(src), banned, "%s: %s (a dependency of %s) mentions %s", p.path, name, main, banned)
				}
			}
		}
	}
	for _, main := range chaos {
		var paths []string
		for _, p := range deps(t, main) {
			paths = append(paths, p.path)
		}
		require.Contains(t, paths, faults, "%s injects no faults", main)
	}
}

// docs/plugins.md's "Faults come from outside" command, run as written by sh in
// the repository: bin/chaos-plugins holds both chaos builds, each with the
// manifest of the shipped plugin's name and kinds (`host plugins manifest`
// starts the binary and checks them), built from the chaos packages.
// Skipped with -short: it builds the host too.
func TestREADMEChaosPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the host and both chaos builds")
	}
	t.Parallel()
	root := hosttest.ModuleRoot(t)
	lines := doctest.Block(t, "docs/plugins.md", "## Faults come from outside", "sh")
	require.Len(t, lines, 1)
	line, _, _ := strings.Cut(lines[0], "  #")
	require.Equal(t, "make chaos-plugins", strings.TrimSpace(line))

	cmd := exec.Command("sh", "-c", lines[0])
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for name, pkg := range map[string]string{"counters": "plugins/counters/chaos", "tickets": "plugins/tickets/chaos"} {
		bin := filepath.Join(root, "bin", "chaos-plugins", name)
		require.FileExists(t, filepath.Join(root, "bin", "chaos-plugins", name+".plugin.json"))
		info, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		require.NoError(t, err, "%s", info)
		require.Contains(t, string(info), "\tpath\t"+module+"/"+pkg+"\n", "%s is not its chaos build", bin)
	}
}

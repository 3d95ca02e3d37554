package effectcheck_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/analysistest"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/usherhq/usher/sdk/analysis/effectcheck"
)

// moduleRoot is the directory of the module's go.mod. The testdata plugin
// is loaded as a package of the module, so it is checked against the real
// SDK, not a stub that could drift from it.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test")
		dir = parent
	}
}

// The testdata plugin commits each mistake once, beside the clean cases
// (a keyed store in Prepare, a send in Effect, a read-only open, a
// test's KeyForTest); its want comments list every report and fact.
func TestBadPlugin(t *testing.T) {
	t.Parallel()
	analysistest.Run(t, moduleRoot(t), effectcheck.Analyzer, "./sdk/analysis/effectcheck/testdata/badplugin/...")
}

// The shipped plugins pass clean.
func TestShippedPlugins(t *testing.T) {
	t.Parallel()
	pkgs, err := packages.Load(&packages.Config{
		Mode:  packages.LoadAllSyntax,
		Dir:   moduleRoot(t),
		Tests: true,
	}, "./plugins/...")
	require.NoError(t, err)
	require.NotEmpty(t, pkgs)
	for _, p := range pkgs {
		require.Empty(t, p.Errors, p.PkgPath)
	}
	graph, err := checker.Analyze([]*analysis.Analyzer{effectcheck.Analyzer}, pkgs, nil)
	require.NoError(t, err)
	var reports []string
	for act := range graph.All() {
		if !act.IsRoot {
			continue
		}
		require.NoError(t, act.Err, act.String())
		for _, d := range act.Diagnostics {
			reports = append(reports, act.Package.Fset.Position(d.Pos).String()+": "+d.Message)
		}
	}
	require.Empty(t, reports)
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/internal/doctest"
)

// docs/plugins.md's "Vet your plugin" lines, run as written by sh: in the
// shipped plugins they pass, in the testdata plugin that commits each
// mistake they fail and name it. go install writes to a GOBIN of the
// test's own, first on PATH, so which finds that build.
func TestREADMEVetYourPlugin(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	lines := doctest.Block(t, "docs/plugins.md", "## Vet your plugin", "sh")
	require.Len(t, lines, 2)

	gobin := t.TempDir()
	run := func(dir, line string) (string, error) {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOBIN="+gobin, "PATH="+gobin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	plugins := filepath.Join(root, "plugins")
	for _, line := range lines {
		out, err := run(plugins, line)
		require.NoError(t, err, "%s: %s", line, out)
	}
	require.FileExists(t, filepath.Join(gobin, "usher-vet"))

	out, err := run(filepath.Join(root, "sdk", "analysis", "effectcheck", "testdata", "badplugin"), lines[1])
	require.Error(t, err, "the vet line passed the plugin that commits each mistake")
	for _, want := range []string{
		"CheckSendMark.Prepare: network call outside the effect phase",
		"SendFromApply.Apply: network call outside the effect phase",
		"CheckSendMark.Commit: network call outside the effect phase",
		"CheckSendMark.Check: marked effect outside the effect phase",
		"sdk.KeyForTest outside a _test.go file",
		"BlankKey.Effect ignores its idempotency key",
		"LoggedKey.Effect never sends its idempotency key key to the provider",
	} {
		require.Contains(t, out, want)
	}
}

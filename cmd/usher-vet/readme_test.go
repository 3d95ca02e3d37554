package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// usher-vet as go vet's tool, as make vet-plugins runs it: the shipped
// plugins pass, and the testdata plugin that commits each mistake fails
// with each named. docs/plugins.md's "Vet your plugin" lines run in a
// plugin module of their own (cmd/host's TestREADMEWriteAPlugin).
func TestUsherVetReportsEachMistake(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	tool := filepath.Join(t.TempDir(), "usher-vet")
	build := exec.Command("go", "build", "-o", tool, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	vet := func(dir string) (string, error) {
		cmd := exec.Command("go", "vet", "-vettool="+tool, "./...")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out2, err := vet(filepath.Join(root, "plugins"))
	require.NoError(t, err, "%s", out2)

	out2, err = vet(filepath.Join(root, "sdk", "analysis", "effectcheck", "testdata", "badplugin"))
	require.Error(t, err, "usher-vet passed the plugin that commits each mistake")
	for _, want := range []string{
		"CheckSendMark.Prepare: network call outside the effect phase",
		"SendFromApply.Apply: network call outside the effect phase",
		"CheckSendMark.Commit: network call outside the effect phase",
		"CheckSendMark.Check: marked effect outside the effect phase",
		"sdk.KeyForTest outside a _test.go file",
		"BlankKey.Effect ignores its idempotency key",
		"LoggedKey.Effect never sends its idempotency key key to the provider",
	} {
		require.Contains(t, out2, want)
	}
}

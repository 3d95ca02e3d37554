package main

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

// `host run` with a retention window under the redelivery bound refuses to
// start and names the bound, as the README's Bounded storage section shows
// (its line run as written); the environment variable is read the same way.
func TestRunRefusesRetentionBelowTheBound(t *testing.T) {
	t.Parallel()
	bin := hosttest.Build(t, "./cmd/host")
	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(work, "bin", "host")))
	lines := doctest.Block(t, "docs/operating.md", "## Bounded storage", "sh")
	require.Len(t, lines, 1)
	cmdline, _, _ := strings.Cut(lines[0], "  #")
	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "ProcessedJobsRetention 10m0s is shorter than the redelivery bound 36m55s")

	cmd = exec.Command(bin, "run", "--reclaim-idle", "5s", "--admin-addr", "")
	cmd.Env = append(cmd.Environ(), "USHER_OUTBOX_RETENTION=1m")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "OutboxRetention 1m0s is shorter than the redelivery bound")
}

package main

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// `host run` with a retention window under the redelivery bound refuses to
// start and names the bound; its environment variable is read the same way.
func TestRunRefusesRetentionBelowTheBound(t *testing.T) {
	t.Parallel()
	bin := hosttest.Build(t, "./cmd/host")
	out, err := exec.Command(bin, "run", "--processed-jobs-retention", "10m", "--admin-addr", "").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "ProcessedJobsRetention 10m0s is shorter than the redelivery bound 37m45s")

	cmd := exec.Command(bin, "run", "--reclaim-idle", "5s", "--admin-addr", "")
	cmd.Env = append(cmd.Environ(), "USHER_OUTBOX_RETENTION=1m")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "OutboxRetention 1m0s is shorter than the redelivery bound")
}

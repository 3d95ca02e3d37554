package pluginhost_test

import (
	"context"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
)

// Once Kill returns, nothing of the instance runs: not go-plugin's stderr
// copy, not the callback server the plugin calls back on (whose handlers
// log into the host's logger). go-plugin's Kill closes the broker and
// returns; the server stopped on its own time, after it: the likely
// writer in CI's race report for TestAdminPortTakenFailsNew, which read
// the host's log once New had failed and killed the plugin.
// Killed right after its start, crashed or not, twenty rounds make a late
// one show on the old code.
func TestKillLeavesNoCallbackServer(t *testing.T) {
	bin := hosttest.Build(t, "./plugins/counters")
	for i := range 20 {
		crashed := i%2 == 1
		inst, err := pluginhost.Start(context.Background(), pluginhost.Config{
			Path: bin, Host: guard.NewHandles("public", hosttest.Logger(t, 0)), Logger: hosttest.Logger(t, 0),
		})
		require.NoError(t, err)
		if crashed {
			require.NoError(t, syscall.Kill(inst.Pid(), syscall.SIGKILL))
			hosttest.Eventually(t, 10*time.Second, "go-plugin to see the process exit", inst.Exited)
		}
		inst.Kill()
		require.Zero(t, goroutinesIn("(*GRPCBroker).AcceptAndServe"), "crashed=%v: a callback server outlived Kill", crashed)
	}
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

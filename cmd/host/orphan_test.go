package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// kill -9 of the host leaves no plugin behind: the plugin watches its
// parent and exits by itself.
func TestPluginsExitWhenTheHostIsKilled(t *testing.T) {
	t.Parallel()
	_, url := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	bin := hosttest.Build(t, "./cmd/host")
	counters := hosttest.Build(t, "./plugins/counters")
	cmd := exec.Command(bin, "run", "--database-url", url, "--stream", stream, "--plugins", counters, "--admin-addr", "")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The host logs the plugin's pid when it is loaded.
	var pid int
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"msg":"plugin loaded"`) {
			i := strings.Index(line, `"pid":`)
			require.Positive(t, i, line)
			pid, err = strconv.Atoi(strings.TrimRight(strings.SplitN(line[i+6:], ",", 2)[0], "}"))
			require.NoError(t, err, line)
			break
		}
	}
	require.Positive(t, pid, "the host never loaded its plugin")
	go func() {
		for sc.Scan() { // keep the pipe drained
		}
	}()
	require.True(t, alive(pid), "the plugin runs")
	require.Equal(t, strconv.Itoa(cmd.Process.Pid), ppid(t, pid), "the plugin is the host's child")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	hosttest.Eventually(t, 10*time.Second, "the orphaned plugin to exit", func() bool { return !alive(pid) })
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func ppid(t *testing.T, pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	require.NoError(t, err)
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return fields[1]
}

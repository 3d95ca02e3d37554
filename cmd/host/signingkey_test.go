package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
)

// The README's signing key commands, run as written: a host started with
// the key file logs that its key came from the file and stores none in the
// database. A short key file is refused with the reason.
func TestSigningKeyFileFromReadme(t *testing.T) {
	t.Parallel()
	pool, dbURL := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	bin := hosttest.Build(t, "./cmd/host")
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "bin", "host")))
	env := append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+hosttest.RedisURL(), "USHER_STREAM="+stream,
		"USHER_ADMIN_ADDR=127.0.0.1:0")
	sh := func(line string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir, cmd.Env = dir, env
		return cmd
	}

	lines := doctest.Block(t, "docs/security.md", "\n## Signing key\n", "sh")
	require.Len(t, lines, 2)
	out, err := sh(lines[0]).CombinedOutput()
	require.NoError(t, err, "%s", out)
	key, err := os.ReadFile(filepath.Join(dir, "signing.key"))
	require.NoError(t, err)
	require.Len(t, key, 32)
	st, err := os.Stat(filepath.Join(dir, "signing.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the README's command makes the key only its owner's")

	run := sh("exec " + lines[1])
	stderr, err := run.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, run.Start())
	t.Cleanup(func() {
		_ = run.Process.Kill()
		_ = run.Wait()
	})
	var log []string
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log = append(log, sc.Text())
			if strings.Contains(sc.Text(), `"msg":"host ready"`) {
				close(ready)
				break
			}
		}
		for sc.Scan() {
		}
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("the host did not log that it was ready within 60s")
	}
	all := strings.Join(log, "\n")
	require.Contains(t, all, `"msg":"stream signing key read from a file","path":"signing.key"`)
	require.Contains(t, all, `"signing_key":"configured (masked)"`)
	require.NotContains(t, all, string(key))
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM runtime_secrets`), "the database holds no key")
	require.NoError(t, run.Process.Signal(syscall.SIGTERM))
	require.NoError(t, run.Wait())

	// A key group or others may read is refused (the README's command
	// without its umask), naming the file and the fix.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "open.key"), key, 0o644))
	require.NoError(t, os.Chmod(filepath.Join(dir, "open.key"), 0o644))
	out, err = sh("bin/host run --signing-key-file open.key").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "signing key file open.key has mode 0644: group or others may read it; refusing it (chmod 600 open.key")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "short.key"), []byte("12345"), 0o600))
	out, err = sh("bin/host run --signing-key-file short.key").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "signing key file short.key holds 5 bytes; a signing key needs at least 32")
}

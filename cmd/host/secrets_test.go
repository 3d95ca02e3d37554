package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// No password on a command line: every local user, a plugin too, reads a
// process's command line in /proc/PID/cmdline. A URL flag holding one is
// refused before anything runs, with where the password goes instead; the
// same URL in the environment is accepted, and the Redis password comes
// from a file only its owner can read. --plugin-env never passes the
// host's secrets on.
func TestNoSecretOnTheCommandLine(t *testing.T) {
	t.Parallel()
	bin := hosttest.Build(t, "./cmd/host")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--redis-url", "redis://usher:change-me@127.0.0.1:1/0"},
			"--redis-url holds a password, and every local user can read a command line (/proc/PID/cmdline); give the password in a file only the host's user can read, --redis-password-file FILE"},
		{[]string{"inspect", "--redis-url=redis://:change-me@127.0.0.1:1/0"}, "--redis-url holds a password"},
		{[]string{"inspect", "--redis-url=redis-cluster://usher:change-me@127.0.0.1:1,127.0.0.1:2"}, "--redis-url holds a password"},
		{[]string{"run", "--database-url", "postgres://usher:change-me@127.0.0.1:1/x"},
			"--database-url holds a password, and every local user can read a command line (/proc/PID/cmdline); give the password in a passfile, PGPASSFILE=FILE"},
		{[]string{"migrate", "--database-url", "host=127.0.0.1 user=usher password=change-me"}, "--database-url holds a password"},
		{[]string{"setup", "--admin-url", "postgres://postgres:change-me@127.0.0.1:1/x"}, "--admin-url holds a password"},
		{[]string{"run", "--plugin-env", "REDIS_URL"}, "REDIS_URL is the host's own secret (or where it is), never a plugin's"},
		{[]string{"run", "--plugin-env", "PGPASSFILE"}, "PGPASSFILE is the host's own secret"},
	} {
		r := runHost(t, bin, []string{"REDIS_URL=redis://u:p@127.0.0.1:1/0", "PGPASSFILE=/nonexistent"}, c.args...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, "%v", c.args)
		require.NotContains(t, r.stderr, "change-me", "%v", c.args)
	}

	// A passfile group or others may read is refused at start, before
	// anything connects.
	passfile := filepath.Join(t.TempDir(), "pgpass")
	require.NoError(t, os.WriteFile(passfile, []byte("*:*:*:usher:change-me\n"), 0o600))
	require.NoError(t, os.Chmod(passfile, 0o644))
	r := runHost(t, bin, []string{"PGPASSFILE=" + passfile}, "run", "--admin-addr=", "--database-url", "postgres://usher@127.0.0.1:1/x")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "passfile "+passfile+" has mode 0644: group or others may read it; refusing it (chmod 600 "+passfile)

	// The help shows the environment's URL as the default, masked.
	r = runHost(t, bin, []string{"REDIS_URL=redis://u:change-me@127.0.0.1:1/0"}, "run", "-h")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "redis://u:xxxxx@127.0.0.1:1/0")
	require.NotContains(t, r.stdout, "change-me")

	// A Redis ACL user's password from a file: a file group or others may
	// read is refused; the owner's alone is used. The URL in REDIS_URL,
	// password and all, is accepted too.
	_, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	ctx := context.Background()
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
	user, pass := "usher_t_"+hosttest.Suffix(), hosttest.Suffix()
	require.NoError(t, rdb.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "resetkeys", "~"+stream+"*", "-@all",
		"+ping", "+xlen", "+xpending", "+xinfo|groups").Err())
	t.Cleanup(func() { _ = rdb.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	pwFile := filepath.Join(t.TempDir(), "redis.password")
	require.NoError(t, os.WriteFile(pwFile, []byte(pass+"\n"), 0o600))
	require.NoError(t, os.Chmod(pwFile, 0o644))
	addr := rdb.Options().Addr
	env := []string{"DATABASE_URL=" + dbURL, "USHER_STREAM=" + stream}
	userURL := fmt.Sprintf("redis://%s@%s/0", user, addr)
	r = runHost(t, bin, env, "inspect", "--redis-url", userURL, "--redis-password-file", pwFile)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "redis password file "+pwFile+" has mode 0644: group or others may read it; refusing it")
	require.NoError(t, os.Chmod(pwFile, 0o600))
	r = runHost(t, bin, env, "inspect", "--redis-url", userURL, "--redis-password-file", pwFile)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "pending")
	r = runHost(t, bin, append(env, "REDIS_URL="+fmt.Sprintf("redis://%s:%s@%s/0", user, pass, addr)), "inspect")
	require.Zero(t, r.code, r.stderr)
	// The wrong password is Redis's refusal, not a silent default user.
	require.NoError(t, os.WriteFile(pwFile, []byte("wrong"), 0o600))
	r = runHost(t, bin, env, "inspect", "--redis-url", userURL, "--redis-password-file", pwFile)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "WRONGPASS")
}

// host run marks its process non-dumpable: a process of its own OS user
// (a plugin started without --plugin-user) cannot read the secrets in its
// environment from /proc/PID/environ, although it can read those of any
// other process of that user.
func TestHostEnvironUnreadableToItsOwnUser(t *testing.T) {
	t.Parallel()
	require.Zero(t, os.Geteuid(), "the tests run as root, to run the host as another user")
	_, dbURL := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	secret := "s3cret-" + hosttest.Suffix()
	// The shared test Redis's default user takes any password.
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "DATABASE_URL=" + dbURL, "USHER_STREAM=" + stream,
		"REDIS_URL=" + strings.Replace(hosttest.RedisURL(), "redis://", "redis://default:"+secret+"@", 1)}
	nobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	hostCmd := exec.Command(hosttest.SharedBinary(t, hosttest.Build(t, "./cmd/host"), "host"), "run", "--admin-addr=")
	hostCmd.Env, hostCmd.Dir, hostCmd.SysProcAttr = env, "/", nobody
	stderr, err := hostCmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, hostCmd.Start())
	t.Cleanup(func() { _ = hostCmd.Process.Kill(); _ = hostCmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"msg":"host ready"`) {
				ready <- true
			}
		}
		close(ready)
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "the host exited before it was ready")
	case <-time.After(60 * time.Second):
		t.Fatal("the host did not log that it was ready within 60s")
	}
	// Another process of the same user: the plugin's place.
	readEnviron := func(pid int) (string, error) {
		cat := exec.Command("cat", fmt.Sprintf("/proc/%d/environ", pid))
		cat.SysProcAttr = nobody
		out, err := cat.CombinedOutput()
		return string(out), err
	}
	out, err := readEnviron(hostCmd.Process.Pid)
	require.Error(t, err, "%s", out)
	require.Contains(t, out, "Permission denied")
	require.NotContains(t, out, secret)
	// The control: a process of that user that did not mark itself so.
	sleep := exec.Command("sleep", "60")
	sleep.Env, sleep.SysProcAttr = env, nobody
	require.NoError(t, sleep.Start())
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	// Start returns once exec has closed the child's close-on-exec pipe,
	// which the kernel does before it sets the new image's environment
	// range: a read in that window is empty, so read until it is not.
	require.Eventually(t, func() bool {
		out, err = readEnviron(sleep.Process.Pid)
		return err == nil && out != ""
	}, 5*time.Second, 10*time.Millisecond, "%v: %s", err, out)
	require.Contains(t, out, secret)
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/doctest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// privateRedis starts a redis-server of the test's own on a free port whose
// default user is off, as a production Redis with ACL users is: only a
// client with a user's password gets in. It returns its address and a
// client logged in as an admin user of the test's.
func privateRedis(t *testing.T) (string, *redis.Client) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	require.NotEqual(t, 6379, port)
	srv := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	require.NoError(t, srv.Start(), "redis-server must be on the PATH")
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	boot := redis.NewClient(&redis.Options{Addr: addr})
	defer boot.Close()
	hosttest.Eventually(t, 10*time.Second, "the private redis-server to answer", func() bool {
		return boot.Ping(context.Background()).Err() == nil
	})
	ctx := context.Background()
	pass := hosttest.Suffix()
	require.NoError(t, boot.Do(ctx, "ACL", "SETUSER", "admin", "on", ">"+pass, "~*", "&*", "+@all").Err())
	require.NoError(t, boot.Do(ctx, "ACL", "SETUSER", "default", "off", "resetpass", "-@all").Err())
	admin := redis.NewClient(&redis.Options{Addr: addr, Username: "admin", Password: pass})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Ping(ctx).Err())
	return addr, admin
}

// hostileHost is `host run` started by sh from the README's Redis commands
// in dir, as written but for the password, user and address: secrets in
// files only root reads, the hostile plugin and counters beside it.
type hostileHost struct {
	pool          *pgxpool.Pool
	stream        string
	ids, probes   []string
	password, key string
	reasons       []string
	// log is what the host logged until it was ready.
	log string
	cmd *exec.Cmd
}

// runHostile starts the host with extra flags, the README's signing key
// and Redis password files in dir, and waits for the hostile jobs to end.
func runHostile(t *testing.T, pluginUser string, cases ...string) *hostileHost {
	t.Helper()
	ctx := context.Background()
	hh := &hostileHost{}
	pool, dbURL := hosttest.DB(t)
	hh.pool = pool
	_, err := pool.Exec(ctx, `CREATE TABLE hostile_effects (job_id text NOT NULL, n int NOT NULL DEFAULT 0);
		GRANT SELECT, INSERT, UPDATE ON hostile_effects TO usher_plugin_hostile`)
	require.NoError(t, err)
	addr, admin := privateRedis(t)
	hh.stream = "usher:{jobs-" + hosttest.Suffix() + "}"

	// The README's ACL user, under the README's name.
	args := strings.Fields(doctest.Block(t, "docs/security.md", "## Redis ACL and TLS", "")[0])
	require.Equal(t, []string{"ACL", "SETUSER", "usher", "on", ">change-me"}, args[:5])
	hh.password = hosttest.Suffix()
	acl := []any{"ACL", "SETUSER", "usher", "on", ">" + hh.password}
	for _, a := range args[5:] {
		acl = append(acl, a)
	}
	require.NoError(t, admin.Do(ctx, acl...).Err())

	// Counters jobs first, then the attacks, each followed by a probe.
	ev, err := orders.CreateEvent(ctx, pool, "Event", "Hall")
	require.NoError(t, err)
	for range 10 {
		_, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 1}, orders.Jobs{Counter: true})
		require.NoError(t, err)
	}
	var msgs []outbox.Message
	for _, c := range cases {
		msgs = append(msgs, outbox.Message{Kind: "hostile_apply", Payload: json.RawMessage(fmt.Sprintf(`{"case": %q}`, c))},
			outbox.Message{Kind: "hostile_apply", Payload: json.RawMessage(`{"case": "clean"}`)})
	}
	var got []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err = outbox.Add(ctx, tx, msgs...)
		return err
	}))
	for i, id := range got {
		if i%2 == 0 {
			hh.ids = append(hh.ids, fmt.Sprint(id))
		} else {
			hh.probes = append(hh.probes, fmt.Sprint(id))
		}
	}

	dir := binDir(t)
	require.NoError(t, os.Chmod(dir, 0o755))
	plugins := []string{hosttest.SharedBinary(t, hosttest.Build(t, "./plugins/counters"), "counters"),
		hosttest.SharedBinary(t, hosttest.Build(t, "./host/testdata/hostileplugin"), "hostile")}
	sh := func(line string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "DATABASE_URL=" + dbURL,
			"USHER_STREAM=" + hh.stream, "USHER_ADMIN_ADDR=127.0.0.1:0"}
		return cmd
	}
	key := doctest.Block(t, "docs/security.md", "\n## Signing key\n", "sh")[0]
	out, err := sh(key).CombinedOutput()
	require.NoError(t, err, "%s", out)
	b, err := os.ReadFile(filepath.Join(dir, "signing.key"))
	require.NoError(t, err)
	hh.key = string(b)
	lines := doctest.Block(t, "docs/security.md", "## Redis ACL and TLS", "sh")
	require.Len(t, lines, 2)
	require.Contains(t, lines[0], "change-me")
	out, err = sh(strings.ReplaceAll(lines[0], "change-me", hh.password)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := strings.ReplaceAll(lines[1], "HOST:6379", addr) + " --signing-key-file signing.key --plugins " + strings.Join(plugins, ",") +
		" --plugin-env HOSTILE_SIBLING=counters --plugin-env HOSTILE_TARGET_KIND=update_sales_counter --plugin-env HOSTILE_STREAM=" + hh.stream + ` --plugin-env 'HOSTILE_PAYLOAD={"order_id": 1}'`
	if pluginUser != "" {
		run += " --plugin-user " + pluginUser
	}
	hh.cmd = sh("exec " + run)
	stderr, err := hh.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, hh.cmd.Start())
	t.Cleanup(func() {
		_ = hh.cmd.Process.Kill()
		_ = hh.cmd.Wait()
	})
	ready := make(chan []string, 1)
	go func() {
		var log []string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log = append(log, sc.Text())
			if strings.Contains(sc.Text(), `"msg":"host ready"`) {
				ready <- log
				break
			}
		}
		close(ready)
		for sc.Scan() {
		}
	}()
	select {
	case log, ok := <-ready:
		require.True(t, ok, "the host exited before it was ready")
		hh.log = strings.Join(log, "\n")
		require.NotContains(t, hh.log, hh.password, "the host never logs the password")
	case <-time.After(60 * time.Second):
		t.Fatal("the host did not log that it was ready within 60s")
	}
	hosttest.Eventually(t, 60*time.Second, "the attacks and their probes ended", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, hh.probes) == int64(len(cases)) &&
			hosttest.Count(t, pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, hh.ids)+
				hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = ANY($1)`, hh.ids) == int64(len(cases))
	})
	rows, err := pool.Query(ctx, `SELECT reason FROM dead_letters WHERE job_id = ANY($1) ORDER BY id`, hh.ids)
	require.NoError(t, err)
	hh.reasons, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return hh
}

// The README's production form against a hostile plugin, through the real
// binary: the Redis password in a 0600 file (--redis-password-file), the
// signing key in a 0600 file, each plugin its own OS user. The plugin reads
// the host's /proc/PID/cmdline and environ and every file they name, then
// tries to log in to Redis and re-add a real entry signed with what it
// found: it finds no secret (the command line holds none, the environ and
// the files are root's), Redis lets it in as nobody, and it attacks its
// sibling in vain. With the plugins run as the host's own user, as before,
// the same plugin reads the files the command line names and rewrites an
// entry signed with the real key: the attack is real.
func TestHostileFindsNoSecretOfTheHost(t *testing.T) {
	t.Parallel()
	require.Zero(t, os.Geteuid(), "the tests run as root, to start plugins as other users")
	t.Run("own users", func(t *testing.T) {
		t.Parallel()
		pattern := hosttest.PluginUsers(t, "counters", "hostile")
		hh := runHostile(t, pattern, "rewrite-redis", "siblings")
		require.Empty(t, hh.reasons, "every attack was refused")
		require.NotContains(t, hh.log, `"level":"WARN"`, "nothing to warn of")
		require.EqualValues(t, 2, hosttest.Count(t, hh.pool, `SELECT count(*) FROM hostile_effects WHERE job_id = ANY($1)`, hh.ids))
		// What the plugin read, the test reads too: nothing of the secrets
		// is on the host's command line.
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hh.cmd.Process.Pid))
		require.NoError(t, err)
		require.Contains(t, string(argv), "--redis-password-file")
		require.NotContains(t, string(argv), hh.password)
		require.NotContains(t, string(argv), hh.key)
		hosttest.Eventually(t, 30*time.Second, "every counters job applied", func() bool {
			return hosttest.Count(t, hh.pool, `SELECT count(*) FROM processed_jobs WHERE kind = 'update_sales_counter'`) == 10
		})
		require.EqualValues(t, 10, hosttest.Count(t, hh.pool, `SELECT seats_sold FROM events`), "no counters job rewritten")
		require.NoError(t, hh.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, hh.cmd.Wait())
	})
	t.Run("the host's user", func(t *testing.T) {
		t.Parallel()
		hh := runHostile(t, "", "rewrite-redis")
		require.Len(t, hh.reasons, 1)
		require.Contains(t, hh.reasons[0], "the file redis.password")
		require.Contains(t, hh.reasons[0], "logged in to Redis as usher")
		require.Contains(t, hh.reasons[0], "signed with a stolen key")
		require.Contains(t, hh.log, "plugins run as the host's own OS user: a plugin can read the host's files and signal it and every other plugin", "host run warned")
	})
}

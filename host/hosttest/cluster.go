package hosttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a Postgres cluster of the test's own, on a free port, that
// authenticates TCP connections with scram-sha-256 (password required, as
// in production) and is removed when the test ends.
type Cluster struct {
	Port int
	// AdminPassword is the superuser postgres's password.
	AdminPassword string
}

// AdminURL is the superuser's URL for database db.
func (c *Cluster) AdminURL(db string) string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", c.AdminPassword, c.Port, db)
}

// StartCluster runs initdb and starts the cluster. initdb and postgres
// refuse to run as root: as root, they run as the postgres user.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		tb.Fatal("hosttest: no /usr/lib/postgresql/*/bin/initdb (make services installs Debian's postgresql)")
	}
	sort.Strings(bins)
	bin := filepath.Dir(bins[len(bins)-1])
	// Not under the test's temp directory: the postgres user must reach it.
	root, err := os.MkdirTemp("", "usher-cluster-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		tb.Fatal(err)
	}
	data, sock := filepath.Join(root, "data"), filepath.Join(root, "sock")
	c := &Cluster{Port: freePort(tb), AdminPassword: Suffix()}
	pwfile := filepath.Join(root, "pw")
	if err := os.WriteFile(pwfile, []byte(c.AdminPassword+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("hosttest: running as root, Postgres must run as the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, p := range []string{root, pwfile} {
			if err := os.Chown(p, uid, gid); err != nil {
				tb.Fatal(err)
			}
		}
	}
	run := func(name string, args ...string) {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = root
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("hosttest: %s: %v\n%s", name, err, out)
		}
	}
	run("initdb", "-D", data, "-U", "postgres", "--pwfile", pwfile, "--auth-local=trust", "--auth-host=scram-sha-256",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if err := os.Mkdir(sock, 0o755); err != nil {
		tb.Fatal(err)
	}
	if cred != nil {
		_ = os.Chown(sock, int(cred.Uid), int(cred.Gid))
	}
	run("pg_ctl", "-D", data, "-w", "-l", filepath.Join(root, "log"), "start", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100", c.Port, sock))
	tb.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		_ = cmd.Run()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.AdminURL("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			return c
		}
		if ctx.Err() != nil {
			tb.Fatalf("hosttest: cluster on port %d did not answer: %v", c.Port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// postgres is a throwaway cluster of chaos' own, so that chaos may restart
// it. The postmaster is a direct child (not daemonised by pg_ctl) so that it
// dies with chaos; a restart is what `pg_ctl restart -m fast|immediate`
// does: SIGINT (fast) or SIGQUIT (immediate) to the postmaster, wait for it
// to exit, start it again.
type postgres struct {
	binDir string
	root   string // temp directory holding data and sock, removed by close
	data   string
	sock   string
	port   int
	cred   *syscall.Credential // run as the postgres user when chaos is root
	logf   *os.File
	p      *proc
}

// pgBinDir returns dir, or the newest Debian Postgres bin directory.
func pgBinDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(m) == 0 {
		return "", errors.New("no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql package (make services) or pass --pg-bin")
	}
	sort.Slice(m, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m[j]))))
		return vi < vj
	})
	return filepath.Dir(m[len(m)-1]), nil
}

// newPostgres runs initdb in a new temporary directory. initdb and postgres
// refuse to run as root: as root, chaos runs them as the postgres user.
func newPostgres(ctx context.Context, binDir, logPath string) (*postgres, error) {
	dir, err := pgBinDir(binDir)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	// Not inside the work directory: the postgres user must be able to
	// reach it, and a test's temp directory is private to root.
	root, err := os.MkdirTemp("", "usher-chaos-pg-")
	if err != nil {
		return nil, err
	}
	pg := &postgres{binDir: dir, root: root, data: filepath.Join(root, "data"), sock: filepath.Join(root, "sock"), port: port}
	fail := func(err error) (*postgres, error) {
		pg.close(true)
		return nil, err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return fail(err)
	}
	for _, d := range []string{pg.data, pg.sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(err)
		}
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, Postgres must run as the postgres user: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		pg.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, d := range []string{pg.data, pg.sock} {
			if err := os.Chown(d, uid, gid); err != nil {
				return fail(err)
			}
		}
	}
	if pg.logf, err = openLog(logPath); err != nil {
		return fail(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "initdb"), "-D", pg.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = pg.logf, pg.logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred}
	if err := cmd.Run(); err != nil {
		return fail(fmt.Errorf("initdb: %w (see %s)", err, logPath))
	}
	// fsync=off is safe against what chaos does (processes crash, the
	// kernel's page cache survives) and keeps a 2-core machine busy with
	// the jobs rather than the disk. synchronous_commit stays on: a
	// committed order must survive an immediate shutdown.
	conf := fmt.Sprintf(`
port = %d
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
fsync = off
max_connections = 200
log_min_messages = warning
log_min_error_statement = panic
`, port, pg.sock)
	f, err := os.OpenFile(filepath.Join(pg.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fail(err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	return pg, nil
}

func (pg *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", pg.port, db)
}

// start runs the postmaster and waits until it accepts connections.
func (pg *postgres) start(ctx context.Context) error {
	cmd := exec.Command(filepath.Join(pg.binDir, "postgres"), "-D", pg.data)
	cmd.Dir = pg.root
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred}
	p, err := spawn("postgres", cmd, pg.logf)
	if err != nil {
		return err
	}
	pg.p = p
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, pg.url("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if p.exited() {
			return fmt.Errorf("postgres exited at start: %s (see %s)", p.exitStatus(), pg.logf.Name())
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres not ready after 60s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop shuts the postmaster down: SIGINT is pg_ctl's -m fast (roll back
// and disconnect every session, checkpoint), SIGQUIT its -m immediate
// (abort every process; the next start runs crash recovery).
func (pg *postgres) stop(sig syscall.Signal) {
	if pg.p == nil {
		return
	}
	_ = pg.p.signal(sig)
	if !pg.p.wait(60 * time.Second) {
		_ = pg.p.signalGroup(syscall.SIGKILL)
		<-pg.p.done
	}
}

// restart is `pg_ctl restart -m fast` (SIGINT) or `-m immediate` (SIGQUIT),
// with down seconds between the stop and the start.
func (pg *postgres) restart(ctx context.Context, sig syscall.Signal, down time.Duration) error {
	pg.stop(sig)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	return pg.start(ctx)
}

// close stops the cluster and, when remove, deletes its directory.
func (pg *postgres) close(remove bool) {
	if pg.p != nil {
		pg.stop(syscall.SIGINT)
	}
	if pg.logf != nil {
		pg.logf.Close()
	}
	if remove && pg.root != "" {
		_ = os.RemoveAll(pg.root)
	}
}

// redisServer is chaos' own Redis, restarted on the same port and data
// directory. With aof, every write is fsynced to the append-only file
// before the client gets its answer (appendfsync always), so a kill -9
// loses nothing a client was told had happened.
type redisServer struct {
	port int
	dir  string
	aof  bool
	logf *os.File
	p    *proc
}

func newRedis(dir, logPath string, aof bool) (*redisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server is not on the PATH: install Debian's redis-server package (make services)")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logf, err := openLog(logPath)
	if err != nil {
		return nil, err
	}
	return &redisServer{port: port, dir: dir, aof: aof, logf: logf}, nil
}

func (r *redisServer) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *redisServer) start(ctx context.Context) error {
	args := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no"}
	if r.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	p, err := spawn("redis", exec.Command("redis-server", args...), r.logf)
	if err != nil {
		return err
	}
	r.p = p
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Ping(ctx).Err() // LOADING while it replays the AOF
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("redis exited at start: %s (see %s)", p.exitStatus(), r.logf.Name())
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis not ready after 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crash kills Redis with -9.
func (r *redisServer) crash() {
	if r.p == nil {
		return
	}
	_ = r.p.signal(syscall.SIGKILL)
	<-r.p.done
}

func (r *redisServer) close() {
	if r.p != nil {
		r.p.stop(syscall.SIGTERM, 10*time.Second)
	}
	if r.logf != nil {
		r.logf.Close()
	}
}

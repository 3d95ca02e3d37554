//go:build e2e

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/client"
)

// TestEndToEnd runs the README's commands: the plugin and its manifest
// (make manifest), host setup, host migrate, host plugins install, host
// run, against a database of its own on USHER_TEST_DATABASE_URL's server
// and USHER_TEST_REDIS_URL. It enqueues refunds and wallet credits with
// client.Enqueue while it kills the plugin with kill -9 once, then counts
// the effects: every refund made once at the provider with its id kept,
// every credit applied once, no dead letter.
//
// It needs the plugin-owned schemas (`host plugins install`, `host plugins
// manifest --migrations --grants`, the plugin's tables in plugin_refunds).
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	root, err := filepath.Abs("../..")
	must(t, err)

	// The README's commands run as written, by sh, from a directory laid
	// out as the repository is (bin/host, examples/refunds), with four
	// changes: the test's databases for the two postgres URLs, the fake
	// provider's URL for https://payments.example, and a deployment of
	// the test's own for setup (so its roles are never the ones the other
	// tests on this cluster hold: its owner is usher_<deployment>).
	hostBin := filepath.Join(work, "bin", "host")
	sh(t, root, nil, "go", "build", "-o", hostBin, "./cmd/host")
	must(t, os.MkdirAll(filepath.Join(work, "examples"), 0o755))
	here, err := filepath.Abs(".")
	must(t, err)
	must(t, os.Symlink(here, filepath.Join(work, "examples", "refunds")))

	deployment := "e" + suffix()[:10]
	adminURL, ownerURL := database(t, deployment)
	provider := startProvider(t)
	lines := readme(t, strings.NewReplacer(
		"bin/host setup ", "bin/host setup --deployment "+deployment+" ",
		"postgres://postgres@127.0.0.1:5432/shop", adminURL,
		"postgres://usher@127.0.0.1:5432/shop", ownerURL,
		"https://payments.example", provider.URL))
	if len(lines) != 5 || !strings.HasPrefix(lines[4], "bin/host run ") {
		t.Fatalf("the README's commands changed: %q", lines)
	}
	env := []string{"HOME=" + work}
	for _, line := range lines[:4] {
		sh(t, work, env, "sh", "-c", line)
	}
	admin, err := pgxpool.New(ctx, adminURL)
	must(t, err)
	defer admin.Close()
	const wallets = 4
	for w := 1; w <= wallets; w++ {
		_, err := admin.Exec(ctx, `INSERT INTO plugin_refunds.wallets (id, balance_cents) VALUES ($1, 1000)`, w)
		must(t, err)
	}

	// The README's run line, with what a test needs after it: its own
	// stream and Redis, no admin port, shorter reclaim and lease.
	stream := "usher:refunds-e2e:{" + suffix() + "}"
	logs := &lockedBuffer{}
	host := exec.Command("sh", "-c", "exec "+lines[4]+" --redis-url "+redisURL()+" --stream '"+stream+"'"+
		" --admin-addr '' --reclaim-idle 5s --plugin-env REFUNDS_CLAIM_LEASE=15s")
	host.Dir = work
	host.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	host.Stdout, host.Stderr = logs, logs
	must(t, host.Start())
	defer func() {
		_ = host.Process.Signal(syscall.SIGTERM)
		_ = host.Wait()
		if t.Failed() {
			t.Logf("host log:\n%s", logs.String())
		}
	}()

	// A steady trickle of jobs, so the kill lands while jobs run.
	const refunds, credits = 150, 150
	enqueued := make(chan error, 1)
	go func() {
		enqueued <- func() error {
			for i := range max(refunds, credits) {
				err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
					if i < refunds {
						if _, err := client.Enqueue(ctx, tx, client.Job{Kind: "refund", RequestID: "e2e",
							Payload: Refund{RefundID: "rf-" + strconv.Itoa(i), PaymentID: "pay-" + strconv.Itoa(i), AmountCents: int64(100 + i), Currency: "EUR"}}); err != nil {
							return err
						}
					}
					if i < credits {
						_, err := client.Enqueue(ctx, tx, client.Job{Kind: "credit_wallet", RequestID: "e2e",
							Payload: CreditWallet{WalletID: int64(1 + i%wallets), AmountCents: int64(1 + i), Reason: "e2e"}})
						return err
					}
					return nil
				})
				if err != nil {
					return err
				}
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}()
	}()

	// Once some of each kind are done, kill -9 the plugin, once.
	applied := func() (ledger, claims int64) {
		must(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM plugin_refunds.wallet_ledger),
			(SELECT count(*) FROM plugin_refunds.refund_claims WHERE done_at IS NOT NULL)`).Scan(&ledger, &claims))
		return ledger, claims
	}
	waitFor(t, ctx, "the first effects", func() bool {
		l, c := applied()
		return l >= 10 && c >= 10
	})
	pid := pluginPID(t, host.Process.Pid)
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	l, c := applied()
	t.Logf("killed plugin pid %d with %d credits and %d refunds applied", pid, l, c)
	require(t, l < credits || c < refunds, "the kill landed after every job was done")
	must(t, <-enqueued)

	// Everything ends: every outbox row done, every effect there.
	waitFor(t, ctx, "every job to finish", func() bool {
		var open int64
		must(t, admin.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE done_at IS NULL`).Scan(&open))
		l, c := applied()
		return open == 0 && l >= credits && c >= refunds
	})
	require(t, pluginPID(t, host.Process.Pid) != pid, "the plugin was restarted")
	time.Sleep(2 * time.Second) // a late duplicate would land now

	// Refunds: one at the provider per refund id, its id in the claim row.
	made, err := provider.refunds(ctx)
	must(t, err)
	byKey := map[string]performed{}
	for _, r := range made {
		_, dup := byKey[r.Key]
		require(t, !dup, "refund %s made twice at the provider", r.Key)
		byKey[r.Key] = r
	}
	require(t, len(made) == refunds, "%d refunds at the provider, want %d", len(made), refunds)
	for i := range refunds {
		r, ok := byKey["refund-rf-"+strconv.Itoa(i)]
		require(t, ok && r.AmountCents == int64(100+i), "refund rf-%d at the provider: %+v", i, r)
		var kept *string
		must(t, admin.QueryRow(ctx, `SELECT provider_refund_id FROM plugin_refunds.refund_claims WHERE refund_id = $1 AND done_at IS NOT NULL`,
			"rf-"+strconv.Itoa(i)).Scan(&kept))
		require(t, kept != nil && *kept == r.ID, "rf-%d keeps provider id %v, the provider made %s", i, kept, r.ID)
	}

	// Credits: each job's entry once, each wallet's balance exact.
	var entries, jobs int64
	must(t, admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT job_id) FROM plugin_refunds.wallet_ledger`).Scan(&entries, &jobs))
	require(t, entries == credits && jobs == credits, "%d ledger entries of %d jobs, want %d of %d", entries, jobs, credits, credits)
	want := map[int64]int64{}
	for i := range credits {
		want[int64(1+i%wallets)] += int64(1 + i)
	}
	for w, sum := range want {
		var balance int64
		must(t, admin.QueryRow(ctx, `SELECT balance_cents FROM plugin_refunds.wallets WHERE id = $1`, w).Scan(&balance))
		require(t, balance == 1000+sum, "wallet %d: balance %d, want %d", w, balance, 1000+sum)
	}

	var dead int64
	must(t, admin.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&dead))
	require(t, dead == 0, "%d dead letters", dead)
}

// database creates a database of the test's own, dropped at its end, and
// returns its URL for the administrator and for the runtime's owner,
// "usher", which host setup creates.
// database creates the test's database and returns the administrator's
// URL and the deployment's owner's (usher_<deployment>) on it; the
// database and the deployment's roles are dropped when the test ends.
func database(t *testing.T, deployment string) (adminURL, ownerURL string) {
	t.Helper()
	base := os.Getenv("USHER_TEST_DATABASE_URL")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	must(t, err)
	defer conn.Close(ctx)
	name := "refunds_e2e_" + suffix()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	must(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			for _, r := range []string{"usher_" + deployment, "usher_" + deployment + "_plugin_refunds", "usher_" + deployment + "_schema_refunds"} {
				_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
			}
			_ = c.Close(context.Background())
		}
	})
	u, err := url.Parse(base)
	must(t, err)
	u.Path = "/" + name
	adminURL = u.String()
	u.User = url.User("usher_" + deployment)
	return adminURL, u.String()
}

func redisURL() string {
	if s := os.Getenv("USHER_TEST_REDIS_URL"); s != "" {
		return s
	}
	return "redis://127.0.0.1:6379/0"
}

// pluginPID is the pid of the refunds process the host started.
func pluginPID(t *testing.T, hostPID int) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	must(t, err)
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid ...
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		// The host runs its kept copy, refunds-<sha256>: comm is its
		// first 15 bytes.
		if comm := s[open+1 : end]; (comm == "refunds" || strings.HasPrefix(comm, "refunds-")) && len(fields) > 1 && fields[1] == strconv.Itoa(hostPID) {
			pid, _ := strconv.Atoi(strings.TrimSpace(s[:open]))
			return pid
		}
	}
	t.Fatalf("no refunds plugin process under host %d", hostPID)
	return 0
}

// sh runs a command in dir, failing the test with its output.
// readme returns the commands of README.md's "Build, install and run"
// block, each through r.
func readme(t *testing.T, r *strings.Replacer) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	must(t, err)
	_, after, ok := strings.Cut(string(b), "## Build, install and run against a host")
	if ok {
		_, after, ok = strings.Cut(after, "```sh\n")
	}
	block, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("README.md has no sh block under \"Build, install and run against a host\"")
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		if cmd, _, _ := strings.Cut(l, "   #"); strings.TrimSpace(cmd) != "" {
			lines = append(lines, r.Replace(strings.TrimSpace(cmd)))
		}
	}
	return lines
}

func sh(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	t.Logf("%s %s\n%s", filepath.Base(name), strings.Join(args, " "), out)
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func suffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func require(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

// lockedBuffer is the host's output, written by its process's pipes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

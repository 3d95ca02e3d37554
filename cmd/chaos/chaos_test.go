package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherhq/usher/internal/doctest"
	"github.com/usherhq/usher/plugins/checkout/checkout"
)

// TestChaosShort runs `chaos --short` against freshly built binaries: its
// own Redis and Postgres, three hosts with their plugins, the mail provider,
// a few hundred orders while every fault type is injected three times, then
// every invariant. CHAOS_SEED replays a seed.
func TestChaosShort(t *testing.T) {
	runShort(t)
}

// TestChaosShortCluster is TestChaosShort on a Redis Cluster of 3
// primaries with a replica each (`chaos --short --redis-cluster`): six
// stream shards, and a primary killed (-9) three times, its replica
// promoted, in place of the Redis restart. Nothing lost, nothing doubled,
// and at least one failover injected. CHAOS_SEED replays a seed.
func TestChaosShortCluster(t *testing.T) {
	out := runShort(t, "--redis-cluster")
	m := regexp.MustCompile(`failovers\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("the summary has no failovers line")
	}
	if n, _ := strconv.Atoi(m[1]); n < 1 {
		t.Fatalf("%s failovers injected, at least 1 wanted", m[1])
	}
}

// runShort runs `chaos --short` with args added, and returns its output.
func runShort(t *testing.T, extra ...string) string {
	if testing.Short() {
		t.Skip("chaos: skipped with -short; the short chaos run takes about 90 seconds")
	}
	bin := buildSystem(t)
	work, err := os.MkdirTemp("", "usher-chaos-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs of every process kept in %s", work)
			return
		}
		_ = os.RemoveAll(work)
	})
	args := append([]string{"--short", "--workdir", work,
		"--host-bin", filepath.Join(bin, "host"),
		"--plugin-dir", filepath.Join(bin, "plugins"),
		"--mailprovider", filepath.Join(bin, "mailprovider")}, extra...)
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		args = append(args, "--seed", s)
	}
	cfg, err := parseConfig(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	what := strings.Join(append([]string{"chaos --short"}, extra...), " ")
	t.Logf("%s, seed %d (CHAOS_SEED=%d replays it)", what, cfg.seed, cfg.seed)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out := &lineLogger{t: t}
	err = runChaos(ctx, cfg, out)
	out.flush()
	if err != nil {
		t.Fatalf("%s (seed %d): %v", what, cfg.seed, err)
	}
	return out.all.String()
}

// buildSystem builds the host, the plugins' chaos builds (with their
// manifests) and the mail provider into a temporary directory, as `make
// build chaos-plugins` does.
func buildSystem(t *testing.T) string {
	t.Helper()
	root := doctest.Root(t)
	bin := t.TempDir()
	if err := os.Mkdir(filepath.Join(bin, "plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is not on the PATH: %v", err)
	}
	targets := map[string]string{
		"host":             "./cmd/host",
		"mailprovider":     "./cmd/mailprovider",
		"plugins/counters": "./plugins/counters/chaos",
		"plugins/tickets":  "./plugins/tickets/chaos",
		"plugins/checkout": "./plugins/checkout/chaos",
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(targets))
	for out, pkg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(gobin, "build", "-o", filepath.Join(bin, out), pkg)
			cmd.Dir = root
			if b, err := cmd.CombinedOutput(); err != nil {
				errs <- errors.New("go build " + pkg + ": " + err.Error() + "\n" + string(b))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for p, kinds := range map[string][]string{"counters": {"update_sales_counter"}, "tickets": {"render_tickets", "send_tickets"},
		"checkout": checkout.Kinds} {
		// As make plugins writes them: the grants, and the tickets
		// plugin's migrations copied beside its binary.
		args := []string{"plugins", "manifest", filepath.Join(bin, "plugins", p), "--name", p, "--version", "1.0.0", "--write",
			"--grants", filepath.Join(root, "plugins", p, "db", "grants.json")}
		if p == "counters" { // its chaos build also records counter_applies
			args[len(args)-1] = filepath.Join(root, "plugins", p, "chaos", "grants.json")
		}
		if p == "checkout" {
			for _, k := range checkout.Enqueues {
				args = append(args, "--enqueue", k)
			}
		}
		if src := filepath.Join(root, "plugins", p, "db", "migrations"); p == "tickets" || p == "checkout" {
			dst := filepath.Join(bin, "plugins", p+"-migrations")
			if err := os.RemoveAll(dst); err != nil {
				t.Fatal(err)
			}
			if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--migrations", dst)
		}
		for _, k := range kinds {
			args = append(args, "--kind", k)
		}
		cmd := exec.Command(filepath.Join(bin, "host"), args...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("host plugins manifest %s: %v\n%s", p, err, b)
		}
	}
	t.Logf("built the host, the plugins and the mail provider in %s", time.Since(start).Round(100*time.Millisecond))
	return bin
}

// lineLogger passes chaos' output to t.Log a line at a time, so a run that
// hangs until the test binary's timeout still shows how far it got.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
	all strings.Builder // everything written
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.t.Log(string(l.buf.Next(i + 1)[:i]))
	}
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() > 0 {
		l.t.Log(l.buf.String())
		l.buf.Reset()
	}
}

package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// syncBuffer is the demo's report, written from its goroutines at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The demo end to end, smaller (40 orders, 20 checkouts), on a database,
// a deployment and a stream of its own, with the plugins' chaos builds and the mail
// provider built from source: it ends OK, and its report shows every
// checkout workflow ended as planned (per state, expected = found), each
// checkout effect once, the timers asleep through the hosts' restart
// fired, and a late payment refused. Skipped with -short: it runs about a
// minute.
func TestDemoRunsCheckouts(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo runs about a minute")
	}
	t.Parallel()
	// A deployment and a database of its own, never make demo's (a
	// deployment's roles belong to one database, so both names are
	// fixed), and a stream of its own.
	const name = "usher_demotest"
	out := &syncBuffer{}
	d := &demo{orders: 40, checkouts: 20, hold: 5 * time.Second, reclaim: 3 * time.Second, lease: 4 * time.Second, seed: 27,
		pluginDir: hosttest.ChaosPlugins(t), mailBin: hosttest.Build(t, "./cmd/mailprovider"), work: t.TempDir(),
		adminURL: hosttest.DatabaseURL(), dbName: name, deployment: "demotest", stream: "usher:demo-test:" + hosttest.Suffix() + ":{jobs}", out: out}
	d.conn.redisURL = hosttest.RedisURL()
	t.Cleanup(func() {
		ctx := context.Background()
		if c, err := pgx.Connect(ctx, hosttest.DatabaseURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	err := d.run(ctx)
	report := out.String()
	require.NoError(t, err, "the demo's report:\n%s", report)

	require.Contains(t, report, "OK: nothing lost, nothing doubled")
	require.NotContains(t, report, "MISMATCH")
	line := func(cols ...string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^\s*` + strings.Join(cols, `\s+`) + `\s*$`)
	}
	// 20 checkouts: 3 left to time out, 3 cancelled, 14 paid.
	require.Regexp(t, line("completed", "14", "14"), report)
	require.Regexp(t, line("cancelled", "payment_timeout", "3", "3"), report)
	require.Regexp(t, line("cancelled", "cancel_requested", "3", "3"), report)
	require.Regexp(t, line("failed", "0", "0"), report)
	require.Regexp(t, line("running", "0", "0"), report)
	for _, effect := range []struct {
		name string
		n    string
	}{
		{`seats reserved \(holds\)`, "20"}, {`seats released \(compensations\)`, "6"}, {"paid: payments recorded", "14"},
		{"paid: stored ticket PDFs", "14"}, {"paid: counter increments", "14"}, {"paid: send_tickets queued", "14"},
		{"paid: emails marked sent", "14"},
	} {
		require.Regexp(t, line(effect.name, effect.n, effect.n, "0", "0"), report, effect.name)
	}
	// The orders' effects count the paid checkouts too: 40 + 14.
	for _, effect := range []string{"counter increments", "stored ticket PDFs", "send_tickets queued", "emails at the provider"} {
		require.Regexp(t, line(effect, "54", "54", "0", "0"), report, effect)
	}
	require.Contains(t, report, "effects that must not exist (a paid checkout released; an unpaid one paid, rendered, counted or mailed): 0")
	require.Contains(t, report, "decision tasks decided twice: 0; steps scheduled twice: 0; signals counted twice: 0")
	require.Contains(t, report, "timed-out checkouts' timers: 3 set, 3 fired once each")
	require.Regexp(t, `the [1-3] asleep through the restart fired at most [0-9.]+m?s after the hosts were back`, report)
	require.Contains(t, report, "a payment after its checkout timed out: refused, and rolled back")
}

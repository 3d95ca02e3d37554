// Package runtest holds the tests of a whole host's lifecycle, alone in a
// package so that a goroutine count means this host's: no other test of
// the package runs beside them.
package runtest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// A service that fails at start (the consumer: its stream key holds a
// string, so its group cannot be made) stops the others: Run returns its
// error, naming it, once every goroutine of every service has ended; the
// plugins' processes are stopped; and Close after the failed Run leaves no
// process and no goroutine behind.
func TestFailingServiceStopsTheHost(t *testing.T) {
	_, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	require.NoError(t, rdb.Set(context.Background(), stream, "not a stream", 0).Err())
	counters := hosttest.Build(t, "./plugins/counters")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := goleak.IgnoreCurrent()

	h, err := host.New(ctx, host.Config{
		DatabaseURL: dbURL, RedisURL: hosttest.RedisURL(), Stream: stream, Plugins: []string{counters},
		AdminAddr: "127.0.0.1:0", AdminTokenFile: filepath.Join(t.TempDir(), "token"), Logger: hosttest.Logger(t, 0),
	})
	require.NoError(t, err)
	plugins := h.Plugins()
	require.Len(t, plugins, 1)
	pid := plugins[0].Pid
	require.NoError(t, syscall.Kill(pid, 0), "the plugin runs once New returned")

	err = h.Run(ctx)
	require.Error(t, err)
	require.ErrorContains(t, err, "service consumer: stream: create group")
	require.ErrorContains(t, err, "WRONGTYPE")
	require.NoError(t, ctx.Err(), "Run returned on the failure, not at the test's deadline")
	h.Close()

	hosttest.Eventually(t, 10*time.Second, "the plugin's process to be gone", func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
	goleak.VerifyNone(t, before)
}

// An admin port that is taken is New's error: the host never says it is
// ready, and the plugin it started is stopped.
func TestAdminPortTakenFailsNew(t *testing.T) {
	_, dbURL := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	counters := hosttest.Build(t, "./plugins/counters")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	var logs syncWriter
	before := goleak.IgnoreCurrent()
	_, err = host.New(context.Background(), host.Config{
		DatabaseURL: dbURL, RedisURL: hosttest.RedisURL(), Stream: stream, Plugins: []string{counters},
		AdminAddr: taken.Addr().String(), AdminTokenFile: filepath.Join(t.TempDir(), "token"),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.ErrorContains(t, err, "admin listener")
	require.ErrorContains(t, err, "address already in use")
	require.NotContains(t, logs.String(), "host ready")
	goleak.VerifyNone(t, before)
}

// syncWriter keeps what is written to it; a goroutine may write while
// another reads.
type syncWriter struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// Run under a context that ends, after it ran jobs, stops every service
// in reverse order and returns nil; Close then leaves no goroutine behind
// (the consumer's workers and acker included).
func TestRunStopsCleanly(t *testing.T) {
	owner, dbURL := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	counters := hosttest.Build(t, "./plugins/counters")
	ev, err := orders.CreateEvent(context.Background(), owner, "Event", "Hall")
	require.NoError(t, err)
	for range 20 {
		_, err := orders.Place(context.Background(), owner, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 1},
			orders.Jobs{Counter: true})
		require.NoError(t, err)
	}
	before := goleak.IgnoreCurrent()
	h, err := host.New(context.Background(), host.Config{
		DatabaseURL: dbURL, RedisURL: hosttest.RedisURL(), Stream: stream, Plugins: []string{counters},
		RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0", AdminTokenFile: filepath.Join(t.TempDir(), "token"), Logger: hosttest.Logger(t, 0),
	})
	require.NoError(t, err)
	pid := h.Plugins()[0].Pid
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	hosttest.Eventually(t, 10*time.Second, "the admin API to listen", func() bool { return h.AdminAddr() != "" })
	hosttest.Eventually(t, 30*time.Second, "the orders counted", func() bool {
		return hosttest.Count(t, owner, `SELECT coalesce(sum(seats_sold), 0) FROM events`) == 20
	})
	cancel()
	require.NoError(t, <-done)
	h.Close()
	hosttest.Eventually(t, 10*time.Second, "the plugin's process to be gone", func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
	goleak.VerifyNone(t, before)
}

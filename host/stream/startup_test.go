package stream_test

import (
	"context"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/localcluster"
)

// A consumer whose Redis does not answer when it starts (a host started
// while a cluster fails a primary over: chaos' cluster run saw a host exit
// with "create group ...: connection refused") waits for it and then
// reads, instead of returning; a reply no wait mends (WRONGTYPE) still
// ends Run at once.
func TestConsumerStartsBeforeItsRedis(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server must be on the PATH: %v", err)
	}
	ports, err := localcluster.Ports(1)
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })

	var ran atomic.Int32
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: []string{"usher:{jobs}"}, Group: "g", Name: "c1", Concurrency: 1,
		Logger: hosttest.Logger(t, 0),
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			ran.Add(1)
			return true
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	// Refused for a while: Run keeps trying.
	select {
	case <-done:
		t.Fatalf("Run returned while Redis was down: %v", runErr)
	case <-time.After(time.Second):
	}

	srv := exec.Command("redis-server", "--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, srv.Start())
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	hosttest.Eventually(t, 30*time.Second, "the group to be created once Redis answers", func() bool {
		groups, err := rdb.XInfoGroups(context.Background(), "usher:{jobs}").Result()
		return err == nil && len(groups) == 1
	})
	require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: "usher:{jobs}", Values: []any{"job_id", "1"}}).Err())
	hosttest.Eventually(t, 30*time.Second, "the entry added after the wait to be read", func() bool { return ran.Load() == 1 })

	// A key of another type is no failover: Run ends with the reply.
	require.NoError(t, rdb.Set(context.Background(), "usher:{other}", "x", 0).Err())
	other, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: []string{"usher:{other}"}, Group: "g", Name: "c2", Concurrency: 1,
		Dispatch: func(ctx context.Context, e stream.Entry) bool { return true },
	})
	require.NoError(t, err)
	err = other.Run(context.Background())
	require.ErrorContains(t, err, "WRONGTYPE")
}

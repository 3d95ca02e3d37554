package stream_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
)

// An entry run again by the redispatcher and held back again at once (a
// kind at its limit asks Later while the redispatcher's task is still in
// Take) is waited for again, not dropped as one already waited for and
// left to the reclaimer.
func TestRedispatchAgainWhileRunning(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, key, "g", "0").Err())
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: map[string]any{"kind": "k", "job_id": "1"}}).Result()
	require.NoError(t, err)
	require.NoError(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, ">"}, Count: 1}).Err())

	var r *stream.Redispatcher
	var takes atomic.Int32
	r, err = stream.NewRedispatcher(stream.RedispatcherConfig{
		Pending: stream.Pending{Redis: rdb, Group: "g", Consumer: "c"},
		Ready:   func(string) bool { return true },
		Take: func(ctx context.Context, _ int, read func(context.Context, int) ([]stream.Entry, error)) (int, error) {
			es, err := read(ctx, 1)
			if takes.Add(1) == 1 && len(es) == 1 {
				r.Later(es[0]) // held back again, from inside this Take
			}
			return len(es), err
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Later once Run is accepting (it takes nothing before): Waiting
	// counts it at once.
	hosttest.Eventually(t, 5*time.Second, "the redispatcher to wait for the entry", func() bool {
		r.Later(stream.Entry{Stream: key, StreamID: id, Kind: "k"})
		return r.Waiting() > 0
	})
	hosttest.Eventually(t, 5*time.Second, "the entry held back again to run again", func() bool { return takes.Load() >= 2 })
}

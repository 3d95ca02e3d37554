package stream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
)

// Arriving counts an entry from the read that takes it until it is handed
// to Dispatch, and never after: a batch waits on it (guard.Config.Arriving),
// so a count that stayed up would hold every batch for its longest wait.
func TestArrivingCountsEntriesUntilDispatch(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	ctx := context.Background()
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		atStart []int
		c       *stream.Consumer
	)
	started := make(chan struct{}, 4)
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Stream: key, Group: "g", Name: "c1", Concurrency: 4,
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			mu.Lock()
			atStart = append(atStart, c.Arriving())
			mu.Unlock()
			started <- struct{}{}
			<-release
			return false // left pending: nothing to ack
		},
	})
	require.NoError(t, err)
	entry := func(i int) stream.Entry {
		return stream.Entry{StreamID: fmt.Sprintf("%d-0", i), JobID: fmt.Sprint(i), Kind: "k"}
	}
	require.Equal(t, 0, c.Arriving(), "nothing read yet")

	// A read for the 4 free slots that finds 3 entries.
	got, err := c.Take(ctx, 4, func(ctx context.Context, n int) ([]stream.Entry, error) {
		require.Equal(t, 4, n)
		require.Equal(t, 4, c.Arriving(), "the read's room counts while it reads")
		return []stream.Entry{entry(1), entry(2), entry(3)}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, got)
	for range 3 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the entries were not all dispatched")
		}
	}
	require.Equal(t, 0, c.Arriving(), "every entry read is in Dispatch")
	mu.Lock()
	for _, a := range atStart {
		require.True(t, a >= 0 && a < 3, "an entry in Dispatch still counted as arriving: %v", atStart)
	}
	mu.Unlock()

	// An entry already running here, read again, is not started twice
	// and does not stay counted.
	got, err = c.Take(ctx, 1, func(ctx context.Context, n int) ([]stream.Entry, error) {
		return []stream.Entry{entry(2)}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, got)
	require.Equal(t, 0, c.Arriving())
	select {
	case <-started:
		t.Fatal("the entry running here was started again")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
}

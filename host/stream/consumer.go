package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Dispatcher runs one entry to completion and reports whether to ack it.
// It returns false to leave the entry pending (the handler did not finish;
// the reclaim loop will hand it out again).
type Dispatcher func(ctx context.Context, e Entry) (ack bool)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Redis client. Required.
	Redis redis.UniversalClient
	// Stream key and Group name. Required.
	Stream, Group string
	// Name of this consumer in the group; unique per host process. Required.
	Name string
	// Concurrency bounds the entries in flight. Default 16.
	Concurrency int
	// Block is how long one XREADGROUP waits. Default 2s. It is never 0:
	// go-redis sends BLOCK 0, "forever", for a zero Block, and a consumer
	// blocked forever cannot notice shutdown.
	Block time.Duration
	// Dispatch runs an entry. Required.
	Dispatch Dispatcher
	// ShutdownGrace is how long Run waits for in-flight entries after ctx is
	// done before abandoning them unacked. Default 10s.
	ShutdownGrace time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *ConsumerConfig) setDefaults() error {
	if c.Redis == nil || c.Stream == "" || c.Group == "" || c.Name == "" || c.Dispatch == nil {
		return errors.New("stream: consumer needs Redis, Stream, Group, Name and Dispatch")
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.Block <= 0 {
		c.Block = 2 * time.Second
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Consumer reads new entries with XREADGROUP and runs them through Dispatch,
// at most Concurrency at a time. Reclaimed entries are submitted to the same
// pool with Submit.
type Consumer struct {
	cfg   ConsumerConfig
	slots chan struct{}
	wg    sync.WaitGroup
	// workCtx outlives the read loop's ctx by ShutdownGrace, so in-flight
	// handlers can commit and ack during shutdown.
	workCtx    context.Context
	cancelWork context.CancelFunc

	// running holds the stream ids in flight here. XAUTOCLAIM hands an
	// entry back to the consumer that is still working on it once it idles
	// past the threshold; starting it twice in one process would only
	// waste a slot.
	mu      sync.Mutex
	running map[string]bool
}

// NewConsumer validates cfg and fills its defaults.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, slots: make(chan struct{}, cfg.Concurrency), running: map[string]bool{}}
	c.workCtx, c.cancelWork = context.WithCancel(context.Background())
	return c, nil
}

// EnsureGroup creates the consumer group (and the stream) if missing,
// reading from the start of the stream so no entry added before the group
// existed is skipped.
func EnsureGroup(ctx context.Context, rdb redis.UniversalClient, streamKey, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, streamKey, group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("stream: create group %s on %s: %w", group, streamKey, err)
	}
	return nil
}

// Run reads until ctx is done, then waits up to ShutdownGrace for in-flight
// entries; those still running are cancelled and left unacked.
func (c *Consumer) Run(ctx context.Context) error {
	if err := EnsureGroup(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it began: nothing read, nothing to drain
		}
		return err
	}
	defer c.drain()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		free := c.acquireSlots(ctx)
		if free == 0 {
			return nil
		}
		res, err := c.cfg.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Name,
			Streams: []string{c.cfg.Stream, ">"},
			Count:   int64(free), Block: c.cfg.Block,
		}).Result()
		got := 0
		if err == nil {
			for _, s := range res {
				for _, m := range s.Messages {
					c.start(Decode(m))
					got++
				}
			}
			backoff = 100 * time.Millisecond
		}
		c.releaseSlots(free - got)
		switch {
		case err == nil, errors.Is(err, redis.Nil):
		case ctx.Err() != nil:
			return nil
		default:
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				// The stream was deleted (Redis restarted without
				// persistence): recreate the group.
				_ = EnsureGroup(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group)
			}
			c.cfg.Logger.Warn("stream read failed; retrying", "stream", c.cfg.Stream, "err", err, "backoff", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
		}
	}
	return nil
}

// Submit runs entries that another loop (the reclaimer) took for this
// consumer, waiting for free slots. It returns when all are started, or
// early when ctx is done (the rest stay pending under this consumer and
// are reclaimed again).
func (c *Consumer) Submit(ctx context.Context, entries []Entry) {
	for _, e := range entries {
		if c.isRunning(e.StreamID) {
			continue
		}
		select {
		case c.slots <- struct{}{}:
			c.start(e)
		case <-ctx.Done():
			return
		}
	}
}

// acquireSlots blocks for at least one free slot, then takes every free one.
func (c *Consumer) acquireSlots(ctx context.Context) int {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	n := 1
	for n < cap(c.slots) {
		select {
		case c.slots <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

func (c *Consumer) releaseSlots(n int) {
	for range n {
		<-c.slots
	}
}

func (c *Consumer) isRunning(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running[id]
}

// start runs e in its own goroutine; the caller holds a slot for it.
func (c *Consumer) start(e Entry) {
	c.mu.Lock()
	if c.running[e.StreamID] {
		c.mu.Unlock()
		<-c.slots
		return
	}
	c.running[e.StreamID] = true
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.slots }()
		defer func() {
			c.mu.Lock()
			delete(c.running, e.StreamID)
			c.mu.Unlock()
		}()
		if !c.cfg.Dispatch(c.workCtx, e) {
			return
		}
		// Ack with a context that survives shutdown: the handler's
		// transaction is committed, and an unacked entry would only be
		// reclaimed and absorbed as a duplicate.
		ackCtx, cancel := context.WithTimeout(context.WithoutCancel(c.workCtx), 5*time.Second)
		defer cancel()
		if err := c.cfg.Redis.XAck(ackCtx, c.cfg.Stream, c.cfg.Group, e.StreamID).Err(); err != nil {
			c.cfg.Logger.Warn("ack failed; the entry will be reclaimed and absorbed by its guard",
				"stream_id", e.StreamID, "job_id", e.JobID, "err", err)
		}
	}()
}

func (c *Consumer) drain() {
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(c.cfg.ShutdownGrace):
		c.cfg.Logger.Warn("shutdown grace over; abandoning in-flight entries unacked")
		c.cancelWork()
		<-done
	}
	c.cancelWork()
}

package stream

import (
	"context"
	"errors"
	"fmt"
	"github.com/usherhq/usher/internal/entry"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"
)

// Dispatcher runs one entry to completion and reports whether to ack it.
// It returns false to leave the entry pending (the handler did not finish;
// the reclaim loop will hand it out again).
type Dispatcher func(ctx context.Context, e Entry) (ack bool)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Redis client. Required.
	Redis redis.UniversalClient
	// Streams are the keys of the stream's shards (ShardKeys), read in
	// turn, each with its priority bands (BandKeys); Group is the
	// consumer group, on every band of every shard. Required.
	Streams []string
	Group   string
	// Name of this consumer in the group; unique per host process. Required.
	Name string
	// Concurrency bounds the entries in flight. Default 16.
	Concurrency int
	// MaxBytes bounds the bytes of entries the consumer holds (read and
	// not yet finished, its reclaimed entries included). Room for an
	// entry, entry.MaxBytes, is reserved before it is read, so the bound
	// holds for the replies Redis sends too; once read, an entry holds
	// what it costs (Entry.Held) until it is finished. Default 64 MiB; at
	// least entry.MaxBytes.
	MaxBytes int64
	// IdlePoll is the longest wait between two reads that found nothing
	// (the wait starts at 5ms and doubles up to it). The read is a script,
	// and Redis refuses BLOCK in scripts; see readScript. Default 200ms.
	IdlePoll time.Duration
	// Dispatch runs an entry. Required.
	Dispatch Dispatcher
	// ShutdownGrace is how long Run waits for in-flight entries after ctx is
	// done before abandoning them unacked. Default 10s.
	ShutdownGrace time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *ConsumerConfig) setDefaults() error {
	if c.Redis == nil || len(c.Streams) == 0 || c.Group == "" || c.Name == "" || c.Dispatch == nil {
		return errors.New("stream: consumer needs Redis, Streams, Group, Name and Dispatch")
	}
	for _, s := range c.Streams {
		if s == "" {
			return errors.New("stream: consumer given an empty stream key")
		}
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 64 << 20
	}
	c.MaxBytes = max(c.MaxBytes, entry.MaxBytes)
	if c.IdlePoll <= 0 {
		c.IdlePoll = 200 * time.Millisecond
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
// at most Concurrency at a time and holding at most MaxBytes of them.
// Reclaimed entries go through the same pool with Take.
type Consumer struct {
	cfg   ConsumerConfig
	slots chan struct{}
	// budget holds MaxBytes; held and peak are what is reserved of it now
	// and at most so far.
	budget     *semaphore.Weighted
	held, peak atomic.Int64
	// arriving counts the entries being read (the room reserved for a
	// read in progress) and those read that have not arrived (Arriving);
	// zero, when not nil, is closed when the count next falls to 0.
	arriving atomic.Int64
	zeroMu   sync.Mutex
	zero     chan struct{}
	wg       sync.WaitGroup
	// workCtx outlives the read loop's ctx by ShutdownGrace, so in-flight
	// handlers can commit and ack during shutdown.
	workCtx    context.Context
	cancelWork context.CancelFunc

	// running holds the entries in flight here, by Entry.Key. XAUTOCLAIM hands an
	// entry back to the consumer that is still working on it once it idles
	// past the threshold; starting it twice in one process would only
	// waste a slot.
	mu      sync.Mutex
	running map[string]*running
	// unacked are the entries finished here whose XACK has not returned:
	// one read again meanwhile (a reclaim of an entry idle past the
	// threshold while its ack waits) is not run a second time.
	unacked map[string]bool
	// detached counts the entries running without a slot (Detach).
	detached int
	// stopped: Run is draining (or has drained); no entry starts.
	stopped bool

	// work feeds Concurrency long-lived workers (a goroutine per entry
	// grows a fresh stack for every job); acks feeds the acker, which
	// acks what the workers finished together in one XACK. acking counts
	// the acks asked for and not yet sent.
	startWorkers sync.Once
	work         chan Entry
	acks         chan ackRequest
	acking       sync.WaitGroup
	ackerDone    chan struct{}
	// wake ends an idle wait early (Wake).
	wake chan struct{}
}

// running is an entry in flight here.
type running struct {
	// detached: its slot was given back while it runs (Detach).
	detached bool
	// settled: its outcome is committed, its ack asked for and its slot
	// given back while Dispatch finishes (Entry.Committed).
	settled bool
}

// ackRequest is one finished entry to ack.
type ackRequest struct {
	stream, id, jobID string
}

// maxAckBatch bounds the ids of one XACK.
const maxAckBatch = 256

// NewConsumer validates cfg and fills its defaults.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, slots: make(chan struct{}, cfg.Concurrency), running: map[string]*running{}, unacked: map[string]bool{},
		budget: semaphore.NewWeighted(cfg.MaxBytes),
		work:   make(chan Entry, cfg.Concurrency), acks: make(chan ackRequest, cfg.Concurrency),
		wake: make(chan struct{}, 1)}
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

// transient reports whether err may pass by itself: the network, or a
// cluster failing a primary over or resharding (CLUSTERDOWN, TRYAGAIN,
// MOVED, ASK, LOADING, MASTERDOWN, READONLY). Any other reply, such as
// NOPERM or WRONGTYPE, is an operator's to mend.
func transient(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "LOADING", "MASTERDOWN", "READONLY"} {
		if strings.HasPrefix(reply.Error(), p) {
			return true
		}
	}
	return false
}

// ensureGroups is EnsureGroup on each of keys.
func ensureGroups(ctx context.Context, rdb redis.UniversalClient, keys []string, group string) error {
	for _, k := range keys {
		if err := EnsureGroup(ctx, rdb, k, group); err != nil {
			return err
		}
	}
	return nil
}

// Run reads until ctx is done, then waits up to ShutdownGrace for in-flight
// entries; those still running are cancelled and left unacked.
//
// The shards are read in turn, one read each (a read is one slot's
// script, so a cluster serves each shard from its own primary), each
// read taking the shard's bands highest priority first: after a
// read that found entries the next shard is read at once, so no shard
// starves another; the consumer waits only once a whole round of reads
// found nothing.
func (c *Consumer) Run(ctx context.Context) error {
	// Drained however Run ends: a reclaim or a lease claim may have
	// started entries before the first read, even when there is none.
	defer c.drain()
	bands := make([][]string, len(c.cfg.Streams))
	backoff := 100 * time.Millisecond
	for i, s := range c.cfg.Streams {
		bands[i] = BandKeys(s)
		for {
			err := ensureGroups(ctx, c.cfg.Redis, bands[i], c.cfg.Group)
			if ctx.Err() != nil {
				return nil // stopped before it began: nothing read
			}
			if err == nil {
				break
			}
			if !transient(err) {
				return err
			}
			// A host started while a cluster fails a primary over (or
			// Redis restarts) waits for it, as its reads would, instead
			// of exiting (/healthz, which probes each shard's primary,
			// reports it meanwhile).
			c.cfg.Logger.Warn("stream: creating the group failed; retrying", "stream", s, "err", err, "backoff", backoff)
			wait(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
		}
	}
	backoff = 100 * time.Millisecond
	idle := 5 * time.Millisecond
	// empty counts the reads in a row that found nothing.
	shard, empty := 0, 0
	for ctx.Err() == nil {
		key, keys := c.cfg.Streams[shard], bands[shard]
		shard = (shard + 1) % len(c.cfg.Streams)
		got, err := c.Take(ctx, c.cfg.Concurrency, func(ctx context.Context, n int) ([]Entry, error) {
			return ReadNew(ctx, c.cfg.Redis, keys, c.cfg.Group, c.cfg.Name, n)
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && got > 0:
			backoff, idle, empty = 100*time.Millisecond, 5*time.Millisecond, 0
		case err == nil:
			backoff = 100 * time.Millisecond
			if empty++; empty < len(c.cfg.Streams) {
				continue // the next shard may have some
			}
			empty = 0
			if c.idle(ctx, idle) {
				idle = 5 * time.Millisecond
			} else {
				idle = min(idle*2, c.cfg.IdlePoll)
			}
		default:
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				// The stream was deleted (Redis restarted without
				// persistence): recreate the group.
				_ = ensureGroups(ctx, c.cfg.Redis, keys, c.cfg.Group)
			}
			c.cfg.Logger.Warn("stream read failed; retrying", "stream", key, "err", err, "backoff", backoff)
			wait(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
		}
	}
	return nil
}

// Wake ends the wait after a read that found nothing: the host's relay
// calls it when it has published entries, so they are read now, not at
// the next poll. It never blocks.
func (c *Consumer) Wake() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// idle waits d, or until Wake or ctx is done; it reports whether Wake
// ended it.
func (c *Consumer) idle(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-c.wake:
		return true
	}
	return false
}

func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Take reserves room for up to max entries, a slot and entry.MaxBytes of
// the budget each (waiting for the first, taking more only while they are
// free), calls read with how many fit, starts every entry read returns,
// and gives back the room they do not use. The reader (ReadNew, AutoClaim)
// returns at most that many entries, each costing at most entry.MaxBytes
// (the read script cuts a larger one), so the bytes held never exceed
// MaxBytes, replies in transit included. An entry already running here
// (XAUTOCLAIM hands an entry back to the consumer still working on it) is
// not started twice. Take returns how many entries read returned; it
// returns at once, reading nothing, when ctx is done.
func (c *Consumer) Take(ctx context.Context, max int, read func(ctx context.Context, n int) ([]Entry, error)) (int, error) {
	n := c.reserve(ctx, max)
	if n == 0 {
		return 0, ctx.Err()
	}
	c.addArriving(int64(n))
	entries, err := read(ctx, n)
	if len(entries) > n {
		// A reader that ignored n: run what there is room for and
		// leave the rest pending for the reclaimer.
		c.cfg.Logger.Error("stream: reader returned more entries than asked for", "asked", n, "got", len(entries))
		entries = entries[:n]
	}
	c.addArriving(int64(len(entries) - n))
	for _, e := range entries {
		c.release(0, entry.MaxBytes-min(e.Held, entry.MaxBytes))
		c.start(e)
	}
	c.release(n-len(entries), int64(n-len(entries))*entry.MaxBytes)
	return len(entries), err
}

// reserve blocks for one entry's room, then takes up to max-1 more that
// are free now; it returns how many it took (0 when ctx is done).
func (c *Consumer) reserve(ctx context.Context, max int) int {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	if err := c.budget.Acquire(ctx, entry.MaxBytes); err != nil {
		<-c.slots
		return 0
	}
	c.hold(entry.MaxBytes)
	// The slots of a batch's jobs come back together, from as many
	// workers: let those already runnable give theirs back first, so that
	// one read takes them all instead of one read each (at 64 in flight,
	// reads took about 6 entries without any yield). One yield left the
	// rest of a batch of 16 to a second read about half the time; yielding
	// again while each yield frees more (maxYields at most) ran 16 in
	// flight ~20 % faster over seven interleaved pairs of bin/bench.
	n, yields, took := 1, 0, false
	for n < max {
		select {
		case c.slots <- struct{}{}:
		default:
			// None free now: yield to the workers still giving theirs
			// back, and again while each yield frees more.
			if yields == maxYields || yields > 0 && !took {
				return n
			}
			runtime.Gosched()
			yields, took = yields+1, false
			continue
		}
		if !c.budget.TryAcquire(entry.MaxBytes) {
			<-c.slots
			return n
		}
		c.hold(entry.MaxBytes)
		n, took = n+1, true
	}
	return n
}

// maxYields bounds the yields of one reserve.
const maxYields = 4

func (c *Consumer) hold(b int64) {
	h := c.held.Add(b)
	for {
		p := c.peak.Load()
		if h <= p || c.peak.CompareAndSwap(p, h) {
			return
		}
	}
}

// release gives back slots and bytes.
func (c *Consumer) release(slots int, bytes int64) {
	for range slots {
		<-c.slots
	}
	if bytes > 0 {
		c.held.Add(-bytes)
		c.budget.Release(bytes)
	}
}

// Arriving is how many entries are on their way to their runner's queue,
// and a channel closed when that count next falls to 0 (closed already
// when it is 0). An entry counts from the read that takes it (the room a
// read reserves counts until it returns; the read loop, the reclaimer and
// a redispatch all read through Take) until it has arrived: Dispatch
// calls its Entry.Arrived when the job is queued for its batch, or when
// it knows the job will not join one; else it counts until Dispatch
// returns. A batch about to start waits for the entries arriving
// (guard.Config.Arriving) instead of leaving them to the next one. The
// read loop reads again at once after a read that found entries, so a job
// queued then waits for that read's round trip even when it finds
// nothing.
func (c *Consumer) Arriving() (int, <-chan struct{}) {
	c.zeroMu.Lock()
	defer c.zeroMu.Unlock()
	n := int(c.arriving.Load())
	if n == 0 {
		return 0, closed
	}
	if c.zero == nil {
		c.zero = make(chan struct{})
	}
	return n, c.zero
}

// closed is a channel that is closed.
var closed = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// addArriving adds d to the count of entries arriving, and wakes those
// waiting for it to fall to 0 when it does.
func (c *Consumer) addArriving(d int64) {
	if c.arriving.Add(d) != 0 {
		return
	}
	c.zeroMu.Lock()
	// Still 0 under the lock: Arriving cannot have handed out a channel
	// for a count above it meanwhile.
	if c.zero != nil && c.arriving.Load() == 0 {
		close(c.zero)
		c.zero = nil
	}
	c.zeroMu.Unlock()
}

// BytesHeld is what the consumer holds of its byte budget now: the room
// reserved for reads in progress plus what the entries running cost.
func (c *Consumer) BytesHeld() int64 { return c.held.Load() }

// PeakBytesHeld is the most BytesHeld has been.
func (c *Consumer) PeakBytesHeld() int64 { return c.peak.Load() }

// start hands e to a worker; the caller holds a slot and e.Held bytes for
// it, which are given back when e is finished. There are as many workers
// as slots, so a worker is always free for a slot's entry.
func (c *Consumer) start(e Entry) {
	held := min(e.Held, entry.MaxBytes)
	key := e.Key()
	c.mu.Lock()
	if c.running[key] != nil || c.unacked[key] {
		c.mu.Unlock()
		c.addArriving(-1)
		c.release(1, held)
		return
	}
	if c.stopped {
		// Run is draining: an entry taken now (a reclaim, a lease claim
		// or a redispatch racing the shutdown) stays pending for the
		// reclaimer.
		c.mu.Unlock()
		c.addArriving(-1)
		c.release(1, held)
		return
	}
	c.running[key] = &running{}
	// Counted under the lock that drain takes before it waits: an entry
	// a reclaim or a lease claim hands over while Run drains is either
	// counted here before drain's Wait, or finds stopped set and stays
	// pending (never started after the wait, its ack after the acker).
	c.wg.Add(1)
	c.mu.Unlock()
	c.startWorkers.Do(func() {
		for range c.cfg.Concurrency {
			go c.worker()
		}
		c.ackerDone = make(chan struct{})
		go c.acker()
	})
	c.work <- e
}

func (c *Consumer) worker() {
	for {
		select {
		case e := <-c.work:
			if c.finish(e) {
				// Its slot went to a new worker (Detach).
				return
			}
		case <-c.workCtx.Done():
			return
		}
	}
}

// finish runs e and acks it when the dispatcher says so, then gives back
// its slot (unless Detach or Entry.Committed did) and bytes. It reports
// whether e was detached.
func (c *Consumer) finish(e Entry) (detached bool) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		r := c.running[e.Key()]
		detached = r.detached
		if detached {
			c.detached--
		}
		slots := 1
		if detached || r.settled {
			slots = 0
		}
		delete(c.running, e.Key())
		c.mu.Unlock()
		c.release(slots, min(e.Held, entry.MaxBytes))
	}()
	var arrived, committed atomic.Bool
	e.Arrived = func() {
		if arrived.CompareAndSwap(false, true) {
			c.addArriving(-1)
		}
	}
	e.Committed = func() {
		if committed.CompareAndSwap(false, true) {
			c.settle(e)
		}
	}
	ok := c.cfg.Dispatch(c.workCtx, e)
	e.Arrived()
	if ok {
		e.Committed()
	} else if committed.Load() {
		c.cfg.Logger.Error("stream: an entry settled as committed was not finished; it stays acked", "stream_id", e.StreamID, "job_id", e.JobID)
	}
	return false // the deferred release says whether it was detached
}

// settle acks e, whose outcome is committed, with the others finished
// meanwhile, and gives its slot back for the next read unless Detach did
// (the entry read into it waits for a worker, Entry.Committed). Until the
// ack returns, the entry is not run here again.
func (c *Consumer) settle(e Entry) {
	key := e.Key()
	c.mu.Lock()
	r := c.running[key]
	free := !r.detached
	r.settled = true
	c.unacked[key] = true
	c.mu.Unlock()
	c.acking.Add(1)
	c.acks <- ackRequest{stream: e.Stream, id: e.StreamID, jobID: e.JobID}
	if free {
		c.release(1, 0)
	}
}

// Detach gives back the slot of an entry still running (named by its
// Entry.Key), so that another entry is read and run meanwhile: the host
// detaches a job that has stalled, so a plugin that hangs cannot hold
// every slot. The entry keeps its bytes until it finishes. At most
// Concurrency entries are detached at once; Detach reports whether this
// one was.
func (c *Consumer) Detach(key string) bool {
	c.mu.Lock()
	r := c.running[key]
	if r == nil || r.detached || r.settled || c.detached >= c.cfg.Concurrency {
		c.mu.Unlock()
		return false
	}
	r.detached = true
	c.detached++
	c.mu.Unlock()
	// A worker for the slot: the detached entry's worker ends with it.
	go c.worker()
	c.release(1, 0)
	return true
}

// acker acks finished entries: the first waiting, and every other that is
// waiting by then, in one XACK. No timer: under load the batches form by
// themselves while the previous XACK is on the wire. It outlives Run's
// context (an ack after shutdown still lets its entry rest) and ends once
// Run has drained every entry and their acks.
func (c *Consumer) acker() {
	defer close(c.ackerDone)
	batch := make([]ackRequest, 0, maxAckBatch)
	for first := range c.acks {
		batch = append(batch[:0], first)
	more:
		for len(batch) < maxAckBatch {
			select {
			case r := <-c.acks:
				batch = append(batch, r)
			default:
				break more
			}
		}
		// Ack with a context that survives shutdown: the handlers'
		// transactions are committed, and an unacked entry would only
		// be reclaimed and absorbed as a duplicate.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.workCtx), 5*time.Second)
		failed := c.ack(ctx, batch)
		cancel()
		c.mu.Lock()
		for _, r := range batch {
			delete(c.unacked, r.stream+" "+r.id)
		}
		c.mu.Unlock()
		for _, r := range batch {
			if err := failed[r.stream]; err != nil {
				c.cfg.Logger.Warn("ack failed; the entry will be reclaimed and absorbed by its guard",
					"stream_id", r.id, "job_id", r.jobID, "err", err)
			}
			c.acking.Done()
		}
	}
}

// ack sends one XACK per key of batch's entries (a shard's priority band),
// in one pipeline (a cluster client sends each to its shard's primary),
// and returns the error of each key whose XACK failed. A batch read from
// one key, the common case, is one XACK.
func (c *Consumer) ack(ctx context.Context, batch []ackRequest) map[string]error {
	if oneStream(batch) {
		ids := make([]string, len(batch))
		for i, r := range batch {
			ids[i] = r.id
		}
		if err := c.cfg.Redis.XAck(ctx, batch[0].stream, c.cfg.Group, ids...).Err(); err != nil {
			return map[string]error{batch[0].stream: err}
		}
		return nil
	}
	byStream := map[string][]string{}
	for _, r := range batch {
		byStream[r.stream] = append(byStream[r.stream], r.id)
	}
	cmds := make(map[string]*redis.IntCmd, len(byStream))
	_, _ = c.cfg.Redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for s, ids := range byStream {
			cmds[s] = pipe.XAck(ctx, s, c.cfg.Group, ids...)
		}
		return nil
	})
	var failed map[string]error
	for s, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[s] = err
		}
	}
	return failed
}

// oneStream reports whether every request of batch is for one key.
func oneStream(batch []ackRequest) bool {
	for _, r := range batch[1:] {
		if r.stream != batch[0].stream {
			return false
		}
	}
	return true
}

func (c *Consumer) drain() {
	c.mu.Lock()
	c.stopped = true // no entry starts from here: none is acked after
	c.mu.Unlock()
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
	// The acks of what finished: each XACK is bounded by its own timeout.
	c.acking.Wait()
	c.startWorkers.Do(func() {}) // no worker starts later either
	if c.ackerDone != nil {
		close(c.acks)
		<-c.ackerDone
	}
}

package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/entry"
)

// Channel is the LISTEN/NOTIFY channel the outbox trigger notifies.
const Channel = "usher_outbox"

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Pool is the Postgres pool. Required.
	Pool *pgxpool.Pool
	// Redis is the stream's client. Required.
	Redis redis.UniversalClient
	// Stream is the stream's base key. Required.
	Stream string
	// Shards is how many shards of Stream the entries are spread over
	// (stream.ShardKey, stream.ShardOf: by job identity). Default 1: the
	// base key alone.
	Shards int
	// Key signs every entry (entry.Fields.Sign); consumers dead-letter an entry
	// their key does not verify. At least entry.MinKeyLen bytes. Required:
	// LoadSigningKey reads the cluster's.
	Key []byte
	// BatchSize is how many rows one transaction takes. Default 256.
	BatchSize int
	// PollInterval is the fallback poll when no notification arrives.
	// Default 1s.
	PollInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// AfterPublish, when set, runs after a batch was published and before
	// it is marked. An error aborts the batch unmarked, exactly as a crash
	// between publish and mark would: tests use it to force duplicates.
	AfterPublish func(ids []int64) error
	// OnPublished, when set, is told how many rows each batch published.
	OnPublished func(n int)
	// Replicas, when above 0, is how many replicas must acknowledge a
	// batch's entries (WAIT) before its rows are marked published; a batch
	// short of them stays unpublished and goes out again. Default 0: the
	// mark follows the primary's answer (a failover can then drop entries
	// of published rows, which the reconciler republishes).
	Replicas int
	// ReplicaTimeout is WAIT's timeout. Default DefaultReplicaTimeout.
	ReplicaTimeout time.Duration
	// OnAdded, when set, runs as soon as a batch's entries are on the
	// stream, before the rows are marked: a consumer it wakes reads them
	// while the mark commits.
	OnAdded func()
}

func (c *RelayConfig) setDefaults() error {
	if c.Pool == nil || c.Redis == nil || c.Stream == "" {
		return errors.New("outbox: relay needs Pool, Redis and Stream")
	}
	if len(c.Key) < entry.MinKeyLen {
		return fmt.Errorf("outbox: relay needs a signing Key of at least %d bytes (got %d)", entry.MinKeyLen, len(c.Key))
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.Shards <= 0 {
		c.Shards = 1
	}
	if c.Shards > stream.MaxShards {
		return fmt.Errorf("outbox: relay given %d shards; at most %d", c.Shards, stream.MaxShards)
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.ReplicaTimeout <= 0 {
		c.ReplicaTimeout = DefaultReplicaTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Relay moves committed outbox rows onto the stream. Several relays may run
// at once: FOR UPDATE SKIP LOCKED gives each row to one of them at a time,
// and a row stays unpublished until a relay has both published and marked
// it, so none is lost.
type Relay struct {
	cfg RelayConfig
}

// NewRelay validates cfg and fills its defaults.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg}, nil
}

// Run relays until ctx is done. It wakes on a notification from the outbox
// trigger and polls every PollInterval in case one was missed (or the
// listening connection is down).
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() { r.listen(ctx, wake) })
	defer wg.Wait() // its session closed before Run returns and the pool may close
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-timer.C:
		}
		for {
			n, err := r.RelayOnce(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				r.cfg.Logger.Warn("outbox relay batch failed; will retry", "err", err)
				break
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(r.cfg.PollInterval)
	}
}

func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox listener lost; polling until it is back", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A LISTENing connection must not go back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

type row struct {
	id        int64
	jobID     string
	kind      string
	payload   string
	requestID string
	trace     string
	attempt   int32
	step      bool
	priority  int16
}

// RelayOnce publishes one batch and returns how many rows it published.
// Its transaction takes the rows and marks them published in the round
// trip of its BEGIN, adds their entries to the stream, then commits: the
// mark is seen only once the entries are on the stream (publish, then
// mark), and a relay that dies before its commit leaves the rows to be
// published again.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	// A connection given back inside a transaction is closed by its pool.
	defer conn.Release()
	committed := false
	defer func() {
		if !committed && conn.Conn().PgConn().TxStatus() != 'I' {
			_ = conn.Conn().PgConn().Exec(context.WithoutCancel(ctx), "ROLLBACK").Close()
		}
	}()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// The mark need not wait for its flush to disk: a mark lost with a
	// crash of Postgres leaves its rows to be published again, which is
	// the duplicate a crash between publish and mark already makes.
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue(`
		UPDATE outbox SET published_at = now()
		WHERE id IN (SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id, coalesce(job_id, id::text), kind, payload::text, request_id, trace, attempt,
		          workflow IS NOT NULL AND kind NOT LIKE 'usher.workflow.%', priority`, r.cfg.BatchSize)
	br := conn.SendBatch(ctx, b)
	for range 2 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return 0, fmt.Errorf("outbox: begin: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return 0, fmt.Errorf("outbox: select: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(rw pgx.CollectableRow) (row, error) {
		var x row
		err := rw.Scan(&x.id, &x.jobID, &x.kind, &x.payload, &x.requestID, &x.trace, &x.attempt, &x.step, &x.priority)
		return x, err
	})
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: select: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil // the deferred ROLLBACK ends the empty transaction
	}
	// In the outbox's order (RETURNING keeps none).
	slices.SortFunc(batch, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	ids := make([]int64, len(batch))
	values := make([][]any, len(batch))
	shards := make([]string, len(batch))
	for i, x := range batch {
		ids[i] = x.id
		// The job's shard, and in it its priority's band.
		shards[i] = stream.BandKey(stream.ShardKey(r.cfg.Stream, stream.ShardOf(x.jobID, r.cfg.Shards)), int(x.priority))
		f := entry.Fields{JobID: x.jobID, OutboxID: strconv.FormatInt(x.id, 10), Kind: x.kind, Payload: x.payload,
			RequestID: x.requestID, Trace: x.trace, Attempt: strconv.Itoa(int(x.attempt))}
		if x.step {
			f.Step = "1" // a workflow step's (its decision tasks are not steps)
		}
		if x.priority != entry.DefaultPriority {
			f.Priority = strconv.Itoa(int(x.priority))
		}
		values[i] = f.Values(r.cfg.Key)
	}
	if err := r.publish(ctx, shards, values); err != nil {
		// Some entries may be on the stream: that is the documented
		// duplicate. The rows stay unpublished and go out again.
		return 0, fmt.Errorf("outbox: publish: %w", err)
	}
	if r.cfg.OnAdded != nil {
		r.cfg.OnAdded()
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(ids); err != nil {
			return 0, fmt.Errorf("outbox: after publish: %w", err)
		}
	}
	tag, err := conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() != "COMMIT" {
		err = errors.New("the transaction was rolled back")
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: mark: %w", err)
	}
	committed = true
	if r.cfg.OnPublished != nil {
		r.cfg.OnPublished(len(batch))
	}
	return len(batch), nil
}

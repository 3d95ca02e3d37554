package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

const asynqTaskType = "update_sales_counter"

// asynqHandler records the task id and applies the effect in one
// transaction; a task id already recorded is a duplicate and changes nothing.
func asynqHandler(env *runEnv) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		env.meter.begin()
		id, ok := asynq.GetTaskID(ctx)
		if !ok {
			return errors.New("no task id in context")
		}
		orderID, err := strconv.ParseInt(string(t.Payload()), 10, 64)
		if err != nil {
			return fmt.Errorf("payload: %w: %w", err, asynq.SkipRetry)
		}
		tx, err := env.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		tag, err := tx.Exec(ctx, recordSQL, id)
		if err != nil {
			return fmt.Errorf("record job: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return nil // already applied by an earlier delivery
		}
		if _, err := tx.Exec(ctx, updateSQL, orderID); err != nil {
			return fmt.Errorf("update counter: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		env.meter.commit()
		return nil
	}
}

func runAsynq(ctx context.Context, env *runEnv) error {
	opts, err := redis.ParseURL(env.cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	db := env.cfg.RedisDB
	if db < 0 {
		if db, err = emptyRedisDB(ctx, opts); err != nil {
			return err
		}
	}
	opts.DB = db
	// Enough connections that no worker waits for one.
	opts.PoolSize = env.inflight + 10
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	// asynq has no key prefix: every key of a queue is asynq:{queue}:..., so a
	// queue named for this run keeps its keys apart from anyone else's.
	var b [4]byte
	_, _ = rand.Read(b[:])
	queue := "usher-peers-" + hex.EncodeToString(b[:])
	env.note("hibiken/asynq %s, Redis DB %d, queue %s, tasks enqueued before the clock, Concurrency=%d, other settings default",
		moduleVersion("github.com/hibiken/asynq"), db, queue, env.inflight)
	defer func() {
		if err := deleteAsynqQueue(context.WithoutCancel(ctx), rdb, queue); err != nil {
			env.note("cleanup: %v", err)
		}
	}()

	if err := enqueueAsynq(ctx, rdb, queue, env.cfg.Jobs); err != nil {
		return err
	}

	mux := asynq.NewServeMux()
	mux.Handle(asynqTaskType, asynqHandler(env))
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: env.inflight,
		Queues:      map[string]int{queue: 1},
		LogLevel:    asynq.WarnLevel,
	})
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("asynq start: %w", err)
	}
	waitErr := env.meter.wait(ctx)
	srv.Shutdown()
	if waitErr != nil {
		return waitErr
	}

	var recorded int
	if err := env.pool.QueryRow(ctx, `SELECT count(*) FROM processed_jobs`).Scan(&recorded); err != nil {
		return err
	}
	if recorded != env.cfg.Jobs {
		return fmt.Errorf("processed_jobs: %d of %d jobs recorded", recorded, env.cfg.Jobs)
	}
	return nil
}

// enqueueAsynq enqueues one task per order, task id order-<id>, from a few
// goroutines (asynq has no batch enqueue).
func enqueueAsynq(ctx context.Context, rdb *redis.Client, queue string, jobs int) error {
	client := asynq.NewClientFromRedisClient(rdb)
	const senders = 8
	var wg sync.WaitGroup
	errs := make([]error, senders)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := 1 + s; id <= jobs; id += senders {
				task := asynq.NewTask(asynqTaskType, []byte(strconv.Itoa(id)))
				if _, err := client.EnqueueContext(ctx, task, asynq.Queue(queue), asynq.TaskID("order-"+strconv.Itoa(id))); err != nil {
					errs[s] = fmt.Errorf("asynq enqueue: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// deleteAsynqQueue removes the run's queue and any key left under its prefix.
// It deletes only keys it can name as this run's; it never flushes.
func deleteAsynqQueue(ctx context.Context, rdb *redis.Client, queue string) error {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	err := insp.DeleteQueue(queue, true)
	if errors.Is(err, asynq.ErrQueueNotFound) {
		err = nil
	}
	iter := rdb.Scan(ctx, 0, "asynq:{"+queue+"}:*", 1000).Iterator()
	for iter.Next(ctx) {
		if derr := rdb.Del(ctx, iter.Val()).Err(); derr != nil {
			err = errors.Join(err, derr)
		}
	}
	return errors.Join(err, iter.Err())
}

var keyspaceLine = regexp.MustCompile(`^db(\d+):keys=(\d+)`)

// emptyRedisDB picks the highest-numbered Redis DB holding no keys, so asynq's
// global keys (asynq:servers, asynq:queues, ...) do not mix with anyone's.
func emptyRedisDB(ctx context.Context, opts *redis.Options) (int, error) {
	c := redis.NewClient(opts)
	defer c.Close()
	n := 16
	if v, err := c.ConfigGet(ctx, "databases").Result(); err == nil {
		if d, err := strconv.Atoi(v["databases"]); err == nil {
			n = d
		}
	}
	info, err := c.Info(ctx, "keyspace").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO keyspace: %w", err)
	}
	used := map[int]bool{}
	for _, line := range strings.Split(info, "\n") {
		if m := keyspaceLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			d, _ := strconv.Atoi(m[1])
			used[d] = true
		}
	}
	for d := n - 1; d >= 0; d-- {
		if !used[d] {
			return d, nil
		}
	}
	return 0, errors.New("no empty Redis DB: pass --redis-db")
}

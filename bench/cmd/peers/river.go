package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type counterArgs struct {
	OrderID int64 `json:"order_id"`
}

func (counterArgs) Kind() string { return "update_sales_counter" }

// counterWorker applies the effect and completes its job in one transaction
// (river.JobCompleteTx), River's exactly-once path for database effects.
type counterWorker struct {
	river.WorkerDefaults[counterArgs]
	env *runEnv
}

func (w *counterWorker) Work(ctx context.Context, job *river.Job[counterArgs]) error {
	w.env.meter.begin()
	tx, err := w.env.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, updateSQL, job.Args.OrderID); err != nil {
		return fmt.Errorf("update counter: %w", err)
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return fmt.Errorf("complete job: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.env.meter.commit()
	return nil
}

// riverInsertBatch bounds one InsertMany call.
const riverInsertBatch = 5000

func runRiver(ctx context.Context, env *runEnv) error {
	// River's own pool: its producer, completer and maintenance loops need
	// connections beside the workers' transactions, which use env.pool.
	riverPool, err := newPool(ctx, env.dbURL, 10)
	if err != nil {
		return err
	}
	defer riverPool.Close()
	driver := riverpgxv5.New(riverPool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &counterWorker{env: env})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: env.inflight}},
		Workers:       workers,
		FetchCooldown: env.cfg.RiverFetchCooldown,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	env.note("riverqueue/river %s, riverpgxv5, InsertMany before the clock, MaxWorkers=%d, FetchCooldown=%s, FetchPollInterval=default(1s)",
		moduleVersion("github.com/riverqueue/river"), env.inflight, env.cfg.RiverFetchCooldown)

	params := make([]river.InsertManyParams, 0, riverInsertBatch)
	for id := 1; id <= env.cfg.Jobs; id++ {
		params = append(params, river.InsertManyParams{Args: counterArgs{OrderID: int64(id)}})
		if len(params) == riverInsertBatch || id == env.cfg.Jobs {
			if _, err := client.InsertMany(ctx, params); err != nil {
				return fmt.Errorf("river insert: %w", err)
			}
			params = params[:0]
		}
	}

	if err := client.Start(ctx); err != nil {
		return err
	}
	waitErr := env.meter.wait(ctx)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	stopErr := client.Stop(stopCtx)
	if waitErr != nil {
		return waitErr
	}
	if stopErr != nil {
		return fmt.Errorf("river stop: %w", stopErr)
	}

	var completed int
	if err := env.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&completed); err != nil {
		return err
	}
	if completed != env.cfg.Jobs {
		return fmt.Errorf("river_job: %d of %d jobs completed", completed, env.cfg.Jobs)
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
)

// runPostgres is Postgres's own limit for guard 4: inflight clients, each
// taking the next job and running it as one transaction (record the job id,
// apply the effect only if recorded, commit). No queue at all.
func runPostgres(ctx context.Context, env *runEnv) error {
	env.note("%d clients, one transaction per job: INSERT processed_jobs ON CONFLICT DO NOTHING, UPDATE, COMMIT", env.inflight)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, env.inflight)
	for c := range env.inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id := next.Add(1)
				if id > int64(env.cfg.Jobs) {
					return
				}
				env.meter.begin()
				if err := applyOnce(ctx, env, id); err != nil {
					errs[c] = fmt.Errorf("job %d: %w", id, err)
					return
				}
				env.meter.commit()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return env.meter.wait(ctx)
}

func applyOnce(ctx context.Context, env *runEnv, orderID int64) error {
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, recordSQL, strconv.FormatInt(orderID, 10))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errors.New("job already recorded")
	}
	if _, err := tx.Exec(ctx, updateSQL, orderID); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

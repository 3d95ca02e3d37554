package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// loader is the Stagedoor application: it places orders, each committing
// its update_sales_counter and render_tickets jobs in its transaction.
//
// An order whose COMMIT failed (Postgres restarted under it) may or may not
// exist: the loader places it again, and the checks take the orders that
// exist from the database, not from what the loader believes.
type loader struct {
	c      *chaos
	events []int64
	mix    []orders.Order // the planned orders, from the seed

	checkouts checkoutLoad

	confirmed atomic.Int64 // commits that returned success
	ambiguous atomic.Int64 // commits that returned an error: the order may exist
	failed    atomic.Int64 // attempts that failed before COMMIT (retried)
}

var eventNames = []string{"Nils Frahm", "Kae Tempest", "Arooj Aftab", "Floating Points", "Hania Rani"}

func (c *chaos) newLoader(ctx context.Context) (*loader, error) {
	l := &loader{c: c}
	for i, name := range eventNames {
		id, err := orders.CreateEvent(ctx, c.pool, name, fmt.Sprintf("Hall %d", i+1))
		if err != nil {
			return nil, fmt.Errorf("create event: %w", err)
		}
		l.events = append(l.events, id)
	}
	rng := rand.New(rand.NewPCG(c.cfg.seed, 1))
	l.mix = make([]orders.Order, c.cfg.orders)
	for i := range l.mix {
		l.mix[i] = l.order(rng, "buyer"+strconv.Itoa(i))
	}
	return l, nil
}

func (l *loader) order(rng *rand.Rand, buyer string) orders.Order {
	return orders.Order{EventID: l.events[rng.IntN(len(l.events))], Buyer: buyer,
		Email: buyer + "@example.com", Seats: 1 + rng.IntN(6)}
}

// run places the planned orders at a steady rate over d.
func (l *loader) run(ctx context.Context, d time.Duration) error {
	start := time.Now()
	n := len(l.mix)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				due := start.Add(time.Duration(int64(d) * int64(i) / int64(n)))
				sleepCtx(ctx, time.Until(due))
				if _, err := l.place(ctx, l.mix[i], nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// place commits o, retrying until it commits or ctx is done. hook, when
// set, runs inside the order's transaction before COMMIT: the relay cannot
// see the order's jobs before the hook is through.
func (l *loader) place(ctx context.Context, o orders.Order, hook func(orders.Placed) error) (orders.Placed, error) {
	backoff := 50 * time.Millisecond
	giveUp := time.Now().Add(3 * time.Minute)
	for {
		p, err := l.placeOnce(ctx, o, hook)
		if err == nil {
			l.confirmed.Add(1)
			return p, nil
		}
		if ctx.Err() != nil {
			return p, ctx.Err()
		}
		if time.Now().After(giveUp) {
			return p, fmt.Errorf("no order could be placed for 3 minutes: %w", err)
		}
		sleepCtx(ctx, backoff)
		backoff = min(backoff*2, 2*time.Second)
	}
}

var errAmbiguous = errors.New("commit failed: the order may or may not exist")

func (l *loader) placeOnce(ctx context.Context, o orders.Order, hook func(orders.Placed) error) (orders.Placed, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := l.c.pool.Begin(ctx)
	if err != nil {
		l.failed.Add(1)
		return orders.Placed{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	p, err := orders.PlaceTx(ctx, tx, o, orders.Jobs{Counter: true, Tickets: true})
	if err == nil && hook != nil {
		err = hook(p)
	}
	if err != nil {
		l.failed.Add(1)
		return p, err
	}
	if err := tx.Commit(ctx); err != nil {
		if !errors.Is(err, pgx.ErrTxClosed) {
			l.ambiguous.Add(1)
		}
		return p, fmt.Errorf("%w: %v", errAmbiguous, err)
	}
	return p, nil
}

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// The fates of the loader's checkouts.
const (
	fatePaid = iota
	fateTimeout
	fateCancel
)

// checkoutLoad is the application's side of the checkout workflows: it
// starts each in its order's transaction, pays 70% of them at once from
// the payment's transaction, leaves 15% to time out and cancels 15% once
// their seats are held. Every call is retried through Postgres restarts:
// a start whose commit was ambiguous may have made a checkout the loader
// then starts again, under a new order (the checks read the checkouts
// from the database); a payment and a cancel are idempotent (the payment's
// reference is the signal's id) and stop at a checkout that ended.
type checkoutLoad struct {
	started, paid, cancelled, gaveUp atomic.Int64
}

func isEnded(err error) bool { return err != nil && strings.Contains(err.Error(), "not running") }

// retry runs f until it succeeds, the checkout ended, ctx ends or 3
// minutes pass.
func retry(ctx context.Context, f func() error) error {
	backoff := 50 * time.Millisecond
	giveUp := time.Now().Add(3 * time.Minute)
	for {
		err := f()
		if err == nil || isEnded(err) || ctx.Err() != nil || time.Now().After(giveUp) {
			return err
		}
		sleepCtx(ctx, backoff)
		backoff = min(backoff*2, 2*time.Second)
	}
}

// runCheckouts starts cfg.checkouts checkouts at a steady rate over d.
func (l *loader) runCheckouts(ctx context.Context, d time.Duration) error {
	n := l.c.cfg.checkouts
	if n == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(l.c.cfg.seed, 27))
	fate := make([]int, n)
	for i := range fate {
		switch r := rng.IntN(100); {
		case r < 15:
			fate[i] = fateTimeout
		case r < 30:
			fate[i] = fateCancel
		}
	}
	mix := make([]orders.Order, n)
	for i := range mix {
		mix[i] = l.order(rng, "checkout"+strconv.Itoa(i))
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				sleepCtx(ctx, time.Until(start.Add(time.Duration(int64(d)*int64(i)/int64(n)))))
				if err := l.checkout(ctx, mix[i], fate[i]); err != nil && ctx.Err() == nil {
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

// checkout starts one checkout and plays its fate.
func (l *loader) checkout(ctx context.Context, o orders.Order, fate int) error {
	hold := l.c.cfg.hold
	if fate == fateCancel {
		hold = 10 * time.Minute // cancelled long before it ends
	}
	var c orders.Checkout
	if err := retry(ctx, func() error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		c, err = orders.PlaceCheckout(cctx, l.c.pool, o, hold)
		return err
	}); err != nil {
		return fmt.Errorf("start a checkout: %w", err)
	}
	l.checkouts.started.Add(1)
	switch fate {
	case fatePaid:
		err := retry(ctx, func() error {
			_, err := orders.ConfirmPayment(ctx, l.c.pool, c.ID, c.PublicID, "pay-"+c.PublicID)
			return err
		})
		if err != nil && !isEnded(err) {
			return fmt.Errorf("pay checkout %s: %w", c.PublicID, err)
		}
		l.checkouts.paid.Add(1)
	case fateCancel:
		// Cancelled once its seats are held: the compensation has
		// something to undo.
		deadline := time.Now().Add(3 * time.Minute)
		for ctx.Err() == nil {
			var held bool
			err := l.c.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM plugin_checkout.seat_holds WHERE order_id = $1)`, c.ID).Scan(&held)
			if err == nil && held {
				break
			}
			if time.Now().After(deadline) {
				l.checkouts.gaveUp.Add(1)
				return nil // left running, legitimately waiting on its long hold
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
		err := retry(ctx, func() error {
			_, err := orders.CancelCheckout(ctx, l.c.pool, c.PublicID, "the buyer left")
			return err
		})
		if err != nil && !isEnded(err) {
			return fmt.Errorf("cancel checkout %s: %w", c.PublicID, err)
		}
		l.checkouts.cancelled.Add(1)
	}
	return nil
}

// checkCheckouts checks every checkout workflow in the database: each ended
// (or waits on a hold of minutes, a cancel the loader gave up), none
// failed, and each one's effects are its end's: a completed one held its
// seats once, was paid, rendered, counted, queued and mailed once, and
// released nothing; a cancelled one held and released its seats once each
// (the compensation) and was neither rendered, counted nor mailed; the
// seats still held per event are the completed ones'; no decision taken
// twice, no step scheduled twice, no timer fired twice, no signal counted
// twice.
func (c *chaos) checkCheckouts(ctx context.Context, w *tabwriter.Writer, v *verdict) error {
	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== checkout workflows ==")
	lc := &c.load.checkouts
	fmt.Fprintf(c.out, "started %d (and paid %d, cancelled %d, cancel given up %d) by the loader\n",
		lc.started.Load(), lc.paid.Load(), lc.cancelled.Load(), lc.gaveUp.Load())
	fmt.Fprintln(w, "state\tcause\tcount\t")
	rows, err := c.pool.Query(ctx, `SELECT state, coalesce(result->>'cause', ''), count(*) FROM workflows
		WHERE type = 'checkout' GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return err
	}
	var total int64
	if err := forEach(rows, func(r pgx.Rows) error {
		var state, cause string
		var n int64
		if err := r.Scan(&state, &cause, &n); err != nil {
			return err
		}
		total += n
		if state == "failed" {
			v.fail("%d checkouts failed", n)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t\n", state, cause, n)
		return nil
	}); err != nil {
		return err
	}
	w.Flush()
	if total < lc.started.Load() {
		v.fail("%d checkouts in the database, %d started", total, lc.started.Load())
	}
	const moves = `(SELECT count(*) FROM plugin_checkout.seat_moves m WHERE m.order_id = (w.input->>'order_id')::bigint AND m.delta %s 0)`
	order := `(w.input->>'order_id')::bigint`
	checks := []struct {
		what string
		sql  string
	}{
		{"running checkouts not legitimately waiting (a step, a decision or a timer due soon, after the drain)", busyCheckouts},
		{"completed checkouts not held exactly once", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed' AND ` + fmt.Sprintf(moves, ">") + ` <> 1`},
		{"completed checkouts released", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed' AND ` + fmt.Sprintf(moves, "<") + ` <> 0`},
		{"completed checkouts without their payment", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed'
			AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.order_id = ` + order + `)`},
		{"completed checkouts not counted exactly once", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed'
			AND (SELECT count(*) FROM counter_applies a WHERE a.order_id = ` + order + `) <> 1`},
		{"completed checkouts not rendered", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed'
			AND EXISTS (SELECT 1 FROM tickets t WHERE t.order_id = ` + order + ` AND t.pdf_key IS NULL)`},
		{"completed checkouts whose send was not queued exactly once", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed'
			AND (SELECT count(*) FROM outbox o WHERE o.kind = 'send_tickets' AND o.job_id IS NULL AND (o.payload->>'order_id')::bigint = ` + order + `) <> 1`},
		{"completed checkouts not mailed", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'completed'
			AND NOT EXISTS (SELECT 1 FROM plugin_tickets.email_sends e WHERE e.order_id = ` + order + ` AND e.sent_at IS NOT NULL)`},
		{"cancelled checkouts not held and released exactly once each (none at all when cancelled before the reserve started)", `SELECT count(*) FROM workflows w
			WHERE type = 'checkout' AND state = 'cancelled' AND CASE WHEN w.result->>'never_held' = 'true'
			THEN ` + fmt.Sprintf(moves, ">") + ` <> 0 OR ` + fmt.Sprintf(moves, "<") + ` <> 0
			ELSE ` + fmt.Sprintf(moves, ">") + ` <> 1 OR ` + fmt.Sprintf(moves, "<") + ` <> 1 END`},
		{"cancelled checkouts rendered, counted or mailed", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'cancelled'
			AND (EXISTS (SELECT 1 FROM tickets t WHERE t.order_id = ` + order + ` AND t.pdf_key IS NOT NULL)
			  OR EXISTS (SELECT 1 FROM counter_applies a WHERE a.order_id = ` + order + `)
			  OR EXISTS (SELECT 1 FROM plugin_tickets.email_sends e WHERE e.order_id = ` + order + `))`},
		{"cancelled checkouts with a payment their result does not name (late_payment)", `SELECT count(*) FROM workflows w WHERE type = 'checkout'
			AND state = 'cancelled' AND w.result->>'late_payment' IS NULL AND EXISTS (SELECT 1 FROM payments p WHERE p.order_id = ` + order + `)`},
		{"running checkouts released, or held more than once", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'running'
			AND (` + fmt.Sprintf(moves, ">") + ` > 1 OR ` + fmt.Sprintf(moves, "<") + ` <> 0)`},
		{"timed-out checkouts whose timer did not fire exactly once", `SELECT count(*) FROM workflows w WHERE type = 'checkout' AND state = 'cancelled'
			AND result->>'cause' = 'payment_timeout'
			AND (SELECT count(*) FROM workflow_events e WHERE e.workflow = w.id AND e.type = 'timer_fired') <> 1`},
		{"events whose seats held are not their completed checkouts' seats", `SELECT count(*) FROM events e WHERE e.seats_held <>
			coalesce((SELECT sum(o.seats) FROM orders o JOIN workflows w ON w.type = 'checkout' AND w.state = 'completed'
				AND (w.input->>'order_id')::bigint = o.id WHERE o.event_id = e.id), 0)`},
		{"decision tasks decided twice", `SELECT count(*) FROM (SELECT 1 FROM workflow_decisions GROUP BY workflow, task_job HAVING count(*) > 1) x`},
		{"steps scheduled twice", `SELECT count(*) FROM (SELECT 1 FROM workflow_events WHERE type = 'step_scheduled' GROUP BY workflow, name HAVING count(*) > 1) x`},
		{"timers fired twice", `SELECT count(*) FROM (SELECT 1 FROM workflow_events WHERE type = 'timer_fired' GROUP BY workflow, name HAVING count(*) > 1) x`},
		{"signals counted twice", `SELECT count(*) FROM (SELECT 1 FROM workflow_events WHERE type = 'signal_received' GROUP BY workflow, detail HAVING count(*) > 1) x`},
	}
	fmt.Fprintln(c.out)
	fmt.Fprintln(w, "invariant\tviolations\t")
	for _, ch := range checks {
		sql := ch.sql
		if !strings.HasPrefix(sql, "SELECT") {
			sql = "SELECT " + sql
		}
		var n int64
		if err := c.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			return fmt.Errorf("%s: %w", ch.what, err)
		}
		mark := ""
		if n != 0 {
			mark = "  FAIL"
			v.fail("%s: %d", ch.what, n)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\n", ch.what, n, mark)
	}
	w.Flush()
	return nil
}

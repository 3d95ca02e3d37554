package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/plugins/checkout/flow"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// checkoutPlan is what the demo's checkouts are meant to do.
type checkoutPlan struct {
	// paid get the payment_confirmed signal right after their start;
	// timeout get nothing and time out after the hold; cancel are
	// cancelled once their seats are held (their hold is long).
	paid, timeout, cancel []orders.Checkout
	// held is each event's seats the paid checkouts keep.
	held map[int64]int64
}

func (p checkoutPlan) all() []orders.Checkout {
	return append(append(append([]orders.Checkout{}, p.paid...), p.timeout...), p.cancel...)
}

func orderIDs(cs []orders.Checkout) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return ids
}

func workflowIDs(cs []orders.Checkout) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.Workflow
	}
	return ids
}

// restartReport is the host restart with workflows asleep: the
// checkouts whose timer had not fired when both hosts had stopped, how
// long the stop took, when they started again.
type restartReport struct {
	sleeping []int64
	stopTook time.Duration
	at       time.Time
}

// placeCheckouts starts d.checkouts checkouts, each in its order's
// transaction (usher_start_workflow), and pays most of them at once, each
// from a transaction of its own that records the payment and sends the
// signal; it adds the paid ones' seats to want (the counters' expected
// sums).
func (d *demo) placeCheckouts(ctx context.Context, want map[int64]int64) error {
	var events []int64
	rows, err := d.pool.Query(ctx, `SELECT id FROM events ORDER BY id`)
	if err != nil {
		return err
	}
	if err := forEach(rows, func(r pgx.Rows) error {
		var id int64
		err := r.Scan(&id)
		events = append(events, id)
		return err
	}); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(d.seed, 27))
	const (
		paid = iota
		timeout
		cancel
	)
	fate := make([]int, d.checkouts)
	unpaid := max(1, d.checkouts*15/100)
	for i := range fate {
		switch {
		case i < unpaid:
			fate[i] = timeout
		case i < 2*unpaid:
			fate[i] = cancel
		}
	}
	rng.Shuffle(len(fate), func(i, j int) { fate[i], fate[j] = fate[j], fate[i] })
	type spec struct {
		ev    int64
		seats int
		fate  int
	}
	list := make([]spec, d.checkouts)
	for i := range list {
		list[i] = spec{events[rng.IntN(len(events))], 1 + rng.IntN(4), fate[i]}
	}
	d.plan.held = map[int64]int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(list); i += 4 {
				s := list[i]
				hold := d.hold
				if s.fate == cancel {
					hold = 10 * time.Minute // cancelled long before it ends
				}
				c, err := orders.PlaceCheckout(ctx, d.pool, orders.Order{EventID: s.ev, Buyer: "Checkout " + strconv.Itoa(i),
					Email: fmt.Sprintf("checkout%d@example.com", i), Seats: s.seats}, hold)
				if err == nil && s.fate == paid {
					_, err = orders.ConfirmPayment(ctx, d.pool, c.ID, c.PublicID, "pay-"+c.PublicID)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				switch s.fate {
				case paid:
					d.plan.paid = append(d.plan.paid, c)
					d.plan.held[s.ev] += int64(s.seats)
					want[s.ev] += int64(s.seats)
				case timeout:
					d.plan.timeout = append(d.plan.timeout, c)
				case cancel:
					d.plan.cancel = append(d.plan.cancel, c)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	d.say("started %d checkouts, each in its order's transaction (usher_start_workflow): %d paid at once (payment and signal in one transaction), %d left to time out after %s, %d to be cancelled once their seats are held",
		d.checkouts, len(d.plan.paid), len(d.plan.timeout), d.hold, len(d.plan.cancel))
	return nil
}

// cancelWhenHeld cancels each checkout planned to be cancelled once its
// seats are held (the buyer left: the compensation has something to undo).
func (d *demo) cancelWhenHeld(ctx context.Context, timeout time.Duration) error {
	left := map[int64]orders.Checkout{}
	for _, c := range d.plan.cancel {
		left[c.ID] = c
	}
	deadline := time.Now().Add(timeout)
	for len(left) > 0 {
		var held []int64
		if err := d.pool.QueryRow(ctx, `SELECT coalesce(array_agg(order_id), '{}') FROM plugin_checkout.seat_holds WHERE order_id = ANY($1)`,
			orderIDs(d.plan.cancel)).Scan(&held); err != nil {
			return err
		}
		for _, id := range held {
			c, ok := left[id]
			if !ok {
				continue
			}
			if _, err := orders.CancelCheckout(ctx, d.pool, c.PublicID, "the buyer left"); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			delete(left, id)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: %d checkouts to cancel hold no seats after %s", len(left), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	d.say("cancelled %d checkouts once their seats were held (usher_cancel_workflow)", len(d.plan.cancel))
	return nil
}

// waitSleeping waits until every checkout left to time out has its timer
// set (its first decision taken) and the counters plugin was killed
// (killed closed).
func (d *demo) waitSleeping(ctx context.Context, killed <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ids := workflowIDs(d.plan.timeout)
	for {
		var set int64
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM workflow_timers WHERE workflow = ANY($1)`, ids).Scan(&set); err != nil {
			return err
		}
		select {
		case <-killed:
			if set == int64(len(ids)) {
				return nil
			}
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: after %s, %d of %d checkouts left to time out have their timer set", timeout, set, len(ids))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stopped records the checkouts left to time out whose timer has not
// fired, once both hosts stopped.
func (d *demo) stopped(ctx context.Context, took time.Duration) error {
	d.restart.stopTook = took
	return d.pool.QueryRow(ctx, `SELECT coalesce(array_agg(workflow), '{}') FROM workflow_timers WHERE workflow = ANY($1) AND fired_at IS NULL`,
		workflowIDs(d.plan.timeout)).Scan(&d.restart.sleeping)
}

// waitTimersDue waits, with no host running, until every timer of the
// checkouts left to time out is due.
func (d *demo) waitTimersDue(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var early int64
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM workflow_timers WHERE workflow = ANY($1) AND fire_at > now()`,
			workflowIDs(d.plan.timeout)).Scan(&early); err != nil {
			return err
		}
		if early == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: %d timers not due after %s", early, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// killEveryHolder kills with -9 each plugin process that writes a hit at
// point (a stalled job), once per hit, until ctx ends.
func (d *demo) killEveryHolder(ctx context.Context, dir, point string) {
	done := map[string]bool{}
	for ctx.Err() == nil {
		m, _ := filepath.Glob(filepath.Join(dir, point+".*.hit"))
		for _, f := range m {
			raw, err := os.ReadFile(f)
			if done[f] || err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil {
				continue
			}
			done[f] = true
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				d.reserveKills.Add(1)
				d.say("kill -9 of the checkout plugin pid %d while it held reserve job %s", pid,
					strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), point+"."), ".hit"))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// payLate confirms a payment for a checkout that timed out: the signal is
// refused, and the payment rolls back with it.
func (d *demo) payLate(ctx context.Context) error {
	c := d.plan.timeout[0]
	_, err := orders.ConfirmPayment(ctx, d.pool, c.ID, c.PublicID, "late-"+c.PublicID)
	if err == nil {
		return fmt.Errorf("demo: a payment after checkout %s timed out was accepted", c.PublicID)
	}
	if !strings.Contains(err.Error(), "is cancelled, not running") {
		return err
	}
	d.latePayment = err.Error()
	return nil
}

// checkoutSummary prints the checkouts' states and effects, expected next
// to found, and reports whether every one is right.
func (d *demo) checkoutSummary(ctx context.Context, w *tabwriter.Writer) (bool, error) {
	ok := true
	p := d.plan
	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, "== checkout workflows, by state ==")
	fmt.Fprintln(w, "state\tcause\texpected\tfound\t")
	found := map[string]int64{}
	rows, err := d.pool.Query(ctx, `SELECT state, coalesce(result->>'cause', ''), count(*) FROM workflows
		WHERE type = 'checkout' GROUP BY 1, 2`)
	if err != nil {
		return false, err
	}
	if err := forEach(rows, func(r pgx.Rows) error {
		var state, cause string
		var n int64
		if err := r.Scan(&state, &cause, &n); err != nil {
			return err
		}
		found[state+"\t"+cause] = n
		return nil
	}); err != nil {
		return false, err
	}
	expected := []struct {
		key  string
		want int
	}{
		{"completed\t", len(p.paid)},
		{"cancelled\t" + flow.CauseTimeout, len(p.timeout)},
		{"cancelled\t" + flow.CauseCancel, len(p.cancel)},
		{"failed\t", 0},
		{"running\t", 0},
	}
	listed := map[string]bool{}
	for _, e := range expected {
		listed[e.key] = true
		mark := ""
		if found[e.key] != int64(e.want) {
			mark, ok = "  MISMATCH", false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", e.key, e.want, found[e.key], mark)
	}
	for k, n := range found {
		if !listed[k] {
			ok = false
			fmt.Fprintf(w, "%s\t0\t%d\t  MISMATCH\n", k, n)
		}
	}
	w.Flush()
	// Each checkout ended the way it was meant to: its own state.
	var wrong int64
	if err := d.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM workflows WHERE id = ANY($1) AND state <> 'completed') +
		(SELECT count(*) FROM workflows WHERE id = ANY($2) AND (state <> 'cancelled' OR result->>'cause' <> $4)) +
		(SELECT count(*) FROM workflows WHERE id = ANY($3) AND (state <> 'cancelled' OR result->>'cause' <> $5))`,
		workflowIDs(p.paid), workflowIDs(p.timeout), workflowIDs(p.cancel), flow.CauseTimeout, flow.CauseCancel).Scan(&wrong); err != nil {
		return false, err
	}
	if wrong != 0 {
		ok = false
		fmt.Fprintf(d.out, "checkouts that did not end as planned: %d\n", wrong)
	}

	fmt.Fprintln(d.out)
	fmt.Fprintln(d.out, "== checkout effects (seats: reserve_seats and release_seats, guard: state first) ==")
	fmt.Fprintln(w, "effect\texpected\tfound\tlost\tdoubled\t")
	unpaid := append(append([]orders.Checkout{}, p.timeout...), p.cancel...)
	line := func(name string, want []orders.Checkout, sql string) error {
		var n, distinct int64
		if err := d.pool.QueryRow(ctx, sql, orderIDs(want)).Scan(&n, &distinct); err != nil {
			return err
		}
		lost, doubled := int64(len(want))-distinct, n-distinct
		if lost != 0 || doubled != 0 {
			ok = false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t\n", name, len(want), n, lost, doubled)
		return nil
	}
	for _, l := range []struct {
		name string
		want []orders.Checkout
		sql  string
	}{
		{"seats reserved (holds)", p.all(), `SELECT count(*), count(DISTINCT order_id) FROM plugin_checkout.seat_moves
			WHERE delta > 0 AND order_id = ANY($1)`},
		{"seats released (compensations)", unpaid, `SELECT count(*), count(DISTINCT order_id) FROM plugin_checkout.seat_moves
			WHERE delta < 0 AND order_id = ANY($1)`},
		{"paid: payments recorded", p.paid, `SELECT count(*), count(DISTINCT order_id) FROM payments WHERE order_id = ANY($1)`},
		{"paid: stored ticket PDFs", p.paid, `SELECT count(DISTINCT order_id), count(DISTINCT order_id) FROM tickets
			WHERE pdf_key IS NOT NULL AND order_id = ANY($1)`},
		{"paid: counter increments", p.paid, `SELECT count(*), count(DISTINCT order_id) FROM counter_applies WHERE order_id = ANY($1)`},
		{"paid: send_tickets queued", p.paid, `SELECT count(*), count(DISTINCT (payload->>'order_id')::bigint) FROM outbox
			WHERE kind = 'send_tickets' AND job_id IS NULL AND (payload->>'order_id')::bigint = ANY($1)`},
		{"paid: emails marked sent", p.paid, `SELECT count(*), count(DISTINCT order_id) FROM plugin_tickets.email_sends
			WHERE sent_at IS NOT NULL AND order_id = ANY($1)`},
	} {
		if err := line(l.name, l.want, l.sql); err != nil {
			return false, err
		}
	}
	w.Flush()
	// What must not exist at all: a release of a paid checkout, a
	// render, count, payment or send of an unpaid one.
	var strays int64
	if err := d.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM plugin_checkout.seat_moves WHERE delta < 0 AND order_id = ANY($1)) +
		(SELECT count(*) FROM tickets WHERE pdf_key IS NOT NULL AND order_id = ANY($2)) +
		(SELECT count(*) FROM counter_applies WHERE order_id = ANY($2)) +
		(SELECT count(*) FROM payments WHERE order_id = ANY($2)) +
		(SELECT count(*) FROM plugin_tickets.email_sends WHERE order_id = ANY($2))`, orderIDs(p.paid), orderIDs(unpaid)).Scan(&strays); err != nil {
		return false, err
	}
	fmt.Fprintf(d.out, "effects that must not exist (a paid checkout released; an unpaid one paid, rendered, counted or mailed): %d\n", strays)
	if strays != 0 {
		ok = false
	}

	fmt.Fprintln(d.out)
	fmt.Fprintln(w, "event\tseats held, expected (paid)\theld\t")
	rows, err = d.pool.Query(ctx, `SELECT id, name, seats_held FROM events ORDER BY id`)
	if err != nil {
		return false, err
	}
	if err := forEach(rows, func(r pgx.Rows) error {
		var id, held int64
		var name string
		if err := r.Scan(&id, &name, &held); err != nil {
			return err
		}
		mark := ""
		if held != p.held[id] {
			mark, ok = "  MISMATCH", false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", name, p.held[id], held, mark)
		return nil
	}); err != nil {
		return false, err
	}
	w.Flush()

	// Decisions, timers and signals, each once.
	var twice, stepsTwice, signalsTwice, timersFired, timeoutTimers int64
	var late time.Duration
	if err := d.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM (SELECT 1 FROM workflow_decisions GROUP BY workflow, task_job HAVING count(*) > 1) x),
		(SELECT count(*) FROM (SELECT 1 FROM workflow_events WHERE type = 'step_scheduled' GROUP BY workflow, name HAVING count(*) > 1) x),
		(SELECT count(*) FROM (SELECT 1 FROM workflow_events WHERE type = 'signal_received' GROUP BY workflow, detail HAVING count(*) > 1) x),
		(SELECT count(*) FROM workflow_events WHERE type = 'timer_fired' AND workflow = ANY($1)),
		(SELECT count(*) FROM workflow_timers WHERE workflow = ANY($1)),
		(SELECT (coalesce(extract(epoch FROM max(fired_at - greatest(fire_at, $3::timestamptz))), 0) * 1e9)::bigint
			FROM workflow_timers WHERE workflow = ANY($2))`,
		workflowIDs(p.timeout), d.restart.sleeping, d.restart.at).Scan(&twice, &stepsTwice, &signalsTwice, &timersFired, &timeoutTimers, &late); err != nil {
		return false, err
	}
	fmt.Fprintf(d.out, "decision tasks decided twice: %d; steps scheduled twice: %d; signals counted twice: %d\n", twice, stepsTwice, signalsTwice)
	fmt.Fprintf(d.out, "timed-out checkouts' timers: %d set, %d fired once each\n", timeoutTimers, timersFired)
	if len(d.restart.sleeping) > 0 {
		fmt.Fprintf(d.out, "the %d asleep through the restart fired at most %s after the hosts were back (the hosts' stop took %s)\n",
			len(d.restart.sleeping), late.Round(10*time.Millisecond), d.restart.stopTook.Round(10*time.Millisecond))
	} else {
		fmt.Fprintf(d.out, "no checkout slept through the restart: the hosts' stop took %s, and every timer fired before it ended\n",
			d.restart.stopTook.Round(10*time.Millisecond))
	}
	if twice != 0 || stepsTwice != 0 || signalsTwice != 0 || timersFired != int64(len(p.timeout)) || timeoutTimers != int64(len(p.timeout)) {
		ok = false
	}
	if d.latePayment != "" {
		fmt.Fprintf(d.out, "a payment after its checkout timed out: refused, and rolled back (%s)\n", d.latePayment)
	}
	return ok, nil
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/handlers"
	"github.com/usherhq/usher/plugins/tickets/mail"
)

// The orders of checkouts (their effects follow how the checkout ended,
// not the order) and those of the checkouts that did not complete (no
// render, count or send).
const (
	checkoutOrders = `(SELECT (input->>'order_id')::bigint FROM workflows WHERE type = 'checkout')`
	unpaidOrders   = `(SELECT (input->>'order_id')::bigint FROM workflows WHERE type = 'checkout' AND state <> 'completed')`
	// runningOrders are the orders of checkouts still running: after a
	// drain that did not finish, their effects may have begun (a
	// checkout's order is counted, rendered and mailed before the
	// checkout records its end). Such effects are ahead of their
	// checkout, neither expected nor doubled.
	runningOrders = `(SELECT (input->>'order_id')::bigint FROM workflows WHERE type = 'checkout' AND state = 'running')`
	// busyCheckouts counts running checkouts not legitimately waiting:
	// every one has a step, a decision or a timer due soon, except those
	// left waiting on a hold of minutes (a cancel the loader gave up).
	busyCheckouts = `(SELECT count(*) FROM workflows w WHERE w.type = 'checkout' AND w.state = 'running'
		AND NOT EXISTS (SELECT 1 FROM workflow_timers t WHERE t.workflow = w.id AND t.fired_at IS NULL AND t.fire_at > now() + interval '1 minute')
		  OR w.type = 'checkout' AND w.state = 'running' AND (w.task_job IS NOT NULL
		  OR EXISTS (SELECT 1 FROM workflow_steps s WHERE s.workflow = w.id AND s.state = 'scheduled')))`
)

// progress is a cheap look at where the system is.
type progress struct {
	orders, counted, rendered, sent int64
	busyCheckouts                   int64
	unpublished, scheduled, dead    int64
	pending, undelivered, streamLen int64
	hostsUp                         int
}

func (p progress) quiet() bool {
	return p.unpublished == 0 && p.scheduled == 0 && p.pending == 0 && p.undelivered == 0 && p.busyCheckouts == 0
}

func (p progress) String() string {
	return fmt.Sprintf("orders %d: counted %d, rendered %d, sent %d | checkouts busy %d | unpublished %d, scheduled %d, stream pending %d, undelivered %d, dead letters %d | hosts up %d",
		p.orders, p.counted, p.rendered, p.sent, p.busyCheckouts, p.unpublished, p.scheduled, p.pending, p.undelivered, p.dead, p.hostsUp)
}

func (c *chaos) progress(ctx context.Context) (progress, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var p progress
	err := c.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM orders),
		(SELECT count(*) FROM counter_applies),
		(SELECT count(DISTINCT order_id) FROM tickets WHERE pdf_key IS NOT NULL),
		(SELECT count(*) FROM plugin_tickets.email_sends WHERE sent_at IS NOT NULL),
		(SELECT count(*) FROM outbox WHERE published_at IS NULL),
		(SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL),
		(SELECT count(*) FROM dead_letters),
		`+busyCheckouts).
		Scan(&p.orders, &p.counted, &p.rendered, &p.sent, &p.unpublished, &p.scheduled, &p.dead, &p.busyCheckouts)
	if err != nil {
		return p, err
	}
	if p.pending, p.undelivered, p.streamLen, err = c.streamState(ctx); err != nil {
		return p, err
	}
	for _, h := range c.hosts {
		if h.running() != nil {
			p.hostsUp++
		}
	}
	return p, nil
}

// streamState reads, over every shard, the group's pending count, how many
// entries it has not been delivered yet, and the stream's length. Each
// read names one shard's key, so on a cluster it goes to that shard's
// primary.
func (c *chaos) streamState(ctx context.Context) (pending, undelivered, length int64, err error) {
	for _, key := range c.shards {
		p, u, n, err := shardState(ctx, c.rdb, key)
		if err != nil {
			return 0, 0, 0, err
		}
		pending, undelivered, length = pending+p, undelivered+u, length+n
	}
	return pending, undelivered, length, nil
}

func shardState(ctx context.Context, rdb redis.UniversalClient, key string) (pending, undelivered, length int64, err error) {
	x, err := rdb.XPending(ctx, key, groupName).Result()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("XPENDING %s: %w", key, err)
	}
	st, err := rdb.XInfoStream(ctx, key).Result()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("XINFO STREAM %s: %w", key, err)
	}
	groups, err := rdb.XInfoGroups(ctx, key).Result()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("XINFO GROUPS %s: %w", key, err)
	}
	undelivered = -1
	for _, g := range groups {
		if g.Name != groupName {
			continue
		}
		switch {
		case g.LastDeliveredID == st.LastGeneratedID:
			undelivered = 0
		case g.Lag > 0:
			undelivered = g.Lag
		default:
			undelivered = 1 // behind, by an amount Redis cannot tell
		}
	}
	if undelivered < 0 {
		return 0, 0, 0, fmt.Errorf("%s has no group %q", key, groupName)
	}
	return x.Count, undelivered, st.Length, nil
}

func (c *chaos) progressLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p, err := c.progress(ctx); err == nil {
			c.say("%s", p)
		} else if ctx.Err() == nil {
			c.say("progress unavailable: %v", err)
		}
	}
}

// drain waits until the system is quiet twice in a row a second apart:
// nothing unpublished, nothing scheduled, nothing pending or undelivered
// in the stream. Then nothing is left in flight anywhere.
func (c *chaos) drain(ctx context.Context, timeout time.Duration) error {
	c.say("draining (at most %s)", timeout)
	deadline := time.Now().Add(timeout)
	quietBefore := false
	var last time.Time
	var p progress
	var err error
	for {
		p, err = c.progress(ctx)
		if err == nil && time.Since(last) >= 5*time.Second {
			c.say("drain: %s", p)
			last = time.Now()
		}
		quiet := err == nil && p.quiet() && p.hostsUp == len(c.hosts)
		if quiet && quietBefore {
			c.say("drained: %s", p)
			return nil
		}
		quietBefore = quiet
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("not drained after %s: %w", timeout, err)
			}
			return fmt.Errorf("not drained after %s: %s", timeout, p)
		}
		sleepCtx(ctx, time.Second)
	}
}

// pluginState is a host's /plugins answer.
type pluginState struct {
	Name     string `json:"name"`
	Pid      int    `json:"pid"`
	Healthy  bool   `json:"healthy"`
	Restarts int    `json:"restarts"`
}

// pluginStatus asks every host which plugins it serves, and how healthy.
func (c *chaos) pluginStatus() map[string][]pluginState {
	out := map[string][]pluginState{}
	client := &http.Client{Timeout: 3 * time.Second}
	for _, h := range c.hosts {
		h.mu.Lock()
		admin := h.admin
		h.mu.Unlock()
		req, err := http.NewRequest(http.MethodGet, "http://"+admin+"/plugins", nil)
		if err != nil {
			continue
		}
		req.Header.Set("Authorization", "Bearer "+c.adminToken)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		var ps []pluginState
		_ = json.NewDecoder(resp.Body).Decode(&ps)
		resp.Body.Close()
		out[h.name] = ps
	}
	return out
}

// verdict collects the invariant results.
type verdict struct {
	failures    []string
	lost, dupes int64
}

func (v *verdict) fail(format string, a ...any) {
	v.failures = append(v.failures, fmt.Sprintf(format, a...))
}

// check proves every invariant against Postgres, the stream, the blob
// store and the provider, prints the tables, and reports whether all hold.
func (c *chaos) check(ctx context.Context, loadStart time.Time, drained time.Duration, hostStatus map[string][]pluginState, probeFailures []string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var v verdict
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	c.outMu.Lock()
	defer c.outMu.Unlock()
	fmt.Fprintln(c.out)

	// The orders that exist are the truth: an ambiguous commit may have
	// made one the loader then placed again.
	var n, paidCheckouts int64
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id NOT IN `+checkoutOrders).Scan(&n); err != nil {
		return false, err
	}
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE type = 'checkout' AND state = 'completed'`).Scan(&paidCheckouts); err != nil {
		return false, err
	}
	confirmed, ambiguous := c.load.confirmed.Load(), c.load.ambiguous.Load()
	if n < confirmed || n > confirmed+ambiguous {
		v.fail("orders in the database: %d, confirmed commits %d, ambiguous %d", n, confirmed, ambiguous)
	}

	fmt.Fprintln(c.out, "== sales counters (update_sales_counter, guard: job id recorded) ==")
	fmt.Fprintln(w, "event\texpected seats\tcounter\t")
	rows, err := c.pool.Query(ctx, `
		SELECT e.name, coalesce((SELECT sum(o.seats) FROM orders o WHERE o.event_id = e.id AND o.id NOT IN `+unpaidOrders+`), 0), e.seats_sold,
		       coalesce((SELECT sum(o.seats) FROM orders o WHERE o.event_id = e.id AND o.id IN `+runningOrders+`
		                 AND EXISTS (SELECT 1 FROM counter_applies a WHERE a.order_id = o.id)), 0)
		FROM events e ORDER BY e.id`)
	if err != nil {
		return false, err
	}
	err = forEach(rows, func(r pgx.Rows) error {
		var name string
		var want, got, ahead int64
		if err := r.Scan(&name, &want, &got, &ahead); err != nil {
			return err
		}
		mark := ""
		switch {
		case want+ahead != got:
			mark = "  MISMATCH"
			v.fail("event %s: counter %d, orders' seats %d (and %d of checkouts still running, counted)", name, got, want, ahead)
		case ahead != 0:
			mark = fmt.Sprintf("  +%d of checkouts still running", ahead)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", name, want, got, mark)
		return nil
	})
	if err != nil {
		return false, err
	}
	w.Flush()

	// Effects, per order: the orders and the paid checkouts.
	plainOrders := n
	n += paidCheckouts
	var applies, applyJobs, applyOrders, applyAhead, processedCounter, pdfOrders, badKeys, sendQueued, sendOrders, sendAhead, sentRows, sendRows int64
	if err := c.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM counter_applies),
		(SELECT count(DISTINCT job_id) FROM counter_applies WHERE order_id NOT IN `+runningOrders+`),
		(SELECT count(DISTINCT order_id) FROM counter_applies WHERE order_id NOT IN `+runningOrders+`),
		(SELECT count(DISTINCT order_id) FROM counter_applies WHERE order_id IN `+runningOrders+`),
		(SELECT count(*) FROM processed_jobs WHERE kind = 'update_sales_counter'),
		(SELECT count(*) FROM orders o WHERE o.id NOT IN `+unpaidOrders+` AND NOT EXISTS (SELECT 1 FROM tickets t WHERE t.order_id = o.id AND t.pdf_key IS DISTINCT FROM 'tickets/' || o.public_id || '.pdf')),
		(SELECT count(*) FROM tickets t JOIN orders o ON o.id = t.order_id WHERE t.pdf_key IS NOT NULL AND t.pdf_key <> 'tickets/' || o.public_id || '.pdf'),
		(SELECT count(*) FROM outbox WHERE kind = 'send_tickets' AND job_id IS NULL),
		(SELECT count(DISTINCT payload->>'order_id') FROM outbox WHERE kind = 'send_tickets' AND job_id IS NULL AND (payload->>'order_id')::bigint NOT IN `+runningOrders+`),
		(SELECT count(DISTINCT payload->>'order_id') FROM outbox WHERE kind = 'send_tickets' AND job_id IS NULL AND (payload->>'order_id')::bigint IN `+runningOrders+`),
		(SELECT count(*) FROM plugin_tickets.email_sends WHERE sent_at IS NOT NULL),
		(SELECT count(*) FROM plugin_tickets.email_sends)`).
		Scan(&applies, &applyJobs, &applyOrders, &applyAhead, &processedCounter, &pdfOrders, &badKeys, &sendQueued, &sendOrders, &sendAhead, &sentRows, &sendRows); err != nil {
		return false, err
	}
	// Each order's PDF key and provider key: true for the expected
	// orders, false for those of checkouts still running.
	publicIDs := map[string]bool{}
	orderIDs := map[string]bool{}
	rows, err = c.pool.Query(ctx, `SELECT id, public_id, id NOT IN `+unpaidOrders+` FROM orders WHERE id NOT IN `+unpaidOrders+` OR id IN `+runningOrders)
	if err != nil {
		return false, err
	}
	if err := forEach(rows, func(r pgx.Rows) error {
		var id int64
		var pub string
		var expected bool
		if err := r.Scan(&id, &pub, &expected); err != nil {
			return err
		}
		publicIDs[handlers.PDFKey(pub)] = expected
		orderIDs["tickets-"+strconv.FormatInt(id, 10)] = expected
		return nil
	}); err != nil {
		return false, err
	}
	store, err := blob.NewFS(c.blobDir)
	if err != nil {
		return false, err
	}
	files, err := store.List(ctx, "tickets/")
	if err != nil {
		return false, err
	}
	var filesOfOrders, filesAhead int64
	for _, f := range files {
		switch expected, known := publicIDs[f]; {
		case expected:
			filesOfOrders++
		case known:
			filesAhead++
		}
	}
	msgs, err := c.sentLog(ctx)
	if err != nil {
		return false, err
	}
	keys := map[string]int{}
	var msgsOfOrders, msgsAhead int64
	for _, m := range msgs {
		keys[m.IdempotencyKey]++
		if keys[m.IdempotencyKey] > 1 {
			continue
		}
		switch expected, known := orderIDs[m.IdempotencyKey]; {
		case expected:
			msgsOfOrders++
		case known:
			msgsAhead++
		}
	}
	stats, err := c.mailer.Stats(ctx)
	if err != nil {
		return false, err
	}

	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== effects, per order ==")
	fmt.Fprintln(w, "effect\texpected\tfound\tlost\tdoubled\tahead\t")
	// distinct counts the expected orders that have the effect, ahead
	// those of checkouts still running (only after a drain that did not
	// finish); any other effect found is doubled.
	var aheadAll int64
	effect := func(name string, found, distinct, ahead int64) {
		lost := max(n-distinct, 0)
		doubled := found - distinct - ahead
		v.lost += lost
		v.dupes += doubled
		aheadAll += ahead
		if lost != 0 || doubled != 0 {
			v.fail("%s: %d expected, %d found, %d lost, %d doubled, %d of checkouts still running", name, n, found, lost, doubled, ahead)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t\n", name, n, found, lost, doubled, ahead)
	}
	effect("counter increments (counter_applies)", applies, min(applyJobs, applyOrders), applyAhead)
	effect("counter job ids recorded (processed_jobs)", processedCounter, processedCounter, 0)
	effect("orders whose tickets carry their PDF key", pdfOrders, pdfOrders, 0)
	effect("stored ticket PDFs", int64(len(files)), filesOfOrders, filesAhead)
	effect("send_tickets queued (outbox, job_id NULL)", sendQueued, sendOrders, sendAhead)
	effect("emails at the provider", int64(len(msgs)), msgsOfOrders, msgsAhead)
	effect("email_sends marked sent", sentRows, sentRows, 0)
	w.Flush()
	if aheadAll != 0 {
		fmt.Fprintf(c.out, "ahead: %d effects of checkouts still running (their order is placed; the checkout has not recorded its end), neither lost nor doubled\n", aheadAll)
	}
	if badKeys != 0 {
		v.fail("%d tickets carry a PDF key that is not their order's", badKeys)
	}
	if int64(len(keys)) != msgsOfOrders+msgsAhead {
		v.fail("the provider holds %d keys, %d of which belong to an order (%d of them to checkouts still running)", len(keys), msgsOfOrders+msgsAhead, msgsAhead)
	}
	if sendRows != sentRows {
		v.fail("%d email_sends rows claimed but never marked sent", sendRows-sentRows)
	}

	// Every outbox row accounted for: its job applied, or dead-lettered
	// with a reason.
	type acct struct{ rows, unpublished, applied, dead, unaccounted int64 }
	byKind := map[string]*acct{}
	rows, err = c.pool.Query(ctx, `
		SELECT kind, count(*),
		       count(*) FILTER (WHERE published_at IS NULL),
		       count(*) FILTER (WHERE applied),
		       count(*) FILTER (WHERE NOT applied AND dead),
		       count(*) FILTER (WHERE NOT applied AND NOT dead)
		FROM (
		    SELECT o.kind, o.published_at,
		        CASE o.kind
		        WHEN 'update_sales_counter' THEN EXISTS (SELECT 1 FROM counter_applies a WHERE a.job_id = coalesce(o.job_id, o.id::text))
		        WHEN 'render_tickets' THEN EXISTS (SELECT 1 FROM tickets t WHERE t.order_id = (o.payload->>'order_id')::bigint)
		            AND NOT EXISTS (SELECT 1 FROM tickets t WHERE t.order_id = (o.payload->>'order_id')::bigint AND t.pdf_key IS NULL)
		        WHEN 'send_tickets' THEN EXISTS (SELECT 1 FROM plugin_tickets.email_sends e WHERE e.order_id = (o.payload->>'order_id')::bigint AND e.kind = 'tickets' AND e.sent_at IS NOT NULL)
		        WHEN 'reserve_seats' THEN EXISTS (SELECT 1 FROM plugin_checkout.seat_holds h WHERE h.order_id = (o.payload->>'order_id')::bigint)
		        WHEN 'release_seats' THEN EXISTS (SELECT 1 FROM plugin_checkout.seat_holds h WHERE h.order_id = (o.payload->>'order_id')::bigint AND h.released_at IS NOT NULL)
		        WHEN 'usher.workflow.checkout' THEN o.outcome IN ('applied', 'absorbed')
		        ELSE false END AS applied,
		        EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = coalesce(o.job_id, o.id::text) AND d.reason <> '') AS dead
		    FROM outbox o) x
		GROUP BY kind ORDER BY kind`)
	if err != nil {
		return false, err
	}
	var total acct
	if err := forEach(rows, func(r pgx.Rows) error {
		var k string
		a := &acct{}
		if err := r.Scan(&k, &a.rows, &a.unpublished, &a.applied, &a.dead, &a.unaccounted); err != nil {
			return err
		}
		byKind[k] = a
		total.rows += a.rows
		total.unpublished += a.unpublished
		total.applied += a.applied
		total.dead += a.dead
		total.unaccounted += a.unaccounted
		return nil
	}); err != nil {
		return false, err
	}
	var retries int64
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE job_id IS NOT NULL`).Scan(&retries); err != nil {
		return false, err
	}
	pending, undelivered, streamLen, err := c.streamState(ctx)
	if err != nil {
		return false, err
	}
	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== jobs: every outbox row accounted for ==")
	fmt.Fprintln(w, "kind\toutbox rows\tapplied\tdead-lettered\tunaccounted\tunpublished\t")
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		a := byKind[k]
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t\n", k, a.rows, a.applied, a.dead, a.unaccounted, a.unpublished)
	}
	fmt.Fprintf(w, "all\t%d\t%d\t%d\t%d\t%d\t\n", total.rows, total.applied, total.dead, total.unaccounted, total.unpublished)
	w.Flush()
	fmt.Fprintf(c.out, "%d of those rows are delayed retries that kept their job's identity; the stream holds %d entries; %d pending, %d undelivered\n",
		retries, streamLen, pending, undelivered)
	if total.unaccounted != 0 {
		v.fail("%d outbox rows are neither applied nor dead-lettered", total.unaccounted)
		v.lost += total.unaccounted
		c.listUnaccounted(ctx)
	}
	if total.unpublished != 0 {
		v.fail("%d outbox rows never published", total.unpublished)
	}
	if pending != 0 || undelivered != 0 {
		v.fail("stream entries left: %d pending, %d undelivered", pending, undelivered)
	}
	c.listDeadLetters(ctx, &v)
	if err := c.checkOutcomes(ctx, &v); err != nil {
		return false, err
	}

	// Faults.
	in := c.inj
	in.mu.Lock()
	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== faults injected ==")
	fmt.Fprintln(w, "fault\tinjected\tplanned\trequired\t")
	planned := map[faultKind]int{}
	for _, inj := range in.plan {
		planned[inj.kind]++
	}
	for _, k := range c.cfg.faults {
		// A planned fault may find no target in its 20 s (every host
		// already down); a couple of misses are tolerated, not more.
		required := max(1, min(10, planned[k]-2))
		fmt.Fprintf(w, "%s: %s\t%d\t%d\t%d\t\n", k, faultInfo[k].what, in.counts[k], planned[k], required)
		if in.counts[k] < required {
			v.fail("fault %s injected %d times, %d required", k, in.counts[k], required)
		}
	}
	w.Flush()
	vk := make([]string, 0, len(in.variants))
	for k := range in.variants {
		vk = append(vk, k)
	}
	sort.Strings(vk)
	fmt.Fprintln(w, "  variant\tcount\t")
	for _, k := range vk {
		fmt.Fprintf(w, "  %s\t%d\t\n", k, in.variants[k])
	}
	if stats.FailedInjected > 0 {
		fmt.Fprintf(w, "  mail-error: sends the provider failed on purpose\t%d\t\n", stats.FailedInjected)
	}
	w.Flush()
	if len(in.failovers) > 0 {
		fmt.Fprintln(c.out)
		fmt.Fprintln(c.out, "== failovers (times from the kill) ==")
		fmt.Fprintln(w, "#\tprimary killed\tshards\treplica promoted\tpromoted after\tpause (shards took writes again)\trejoined as a replica\t")
		for i, f := range in.failovers {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", i+1, f.primary, strings.Join(f.shards, " "), f.replica, dur(f.promoted), dur(f.pause), dur(f.rejoined))
		}
		w.Flush()
	}
	for _, m := range in.missed {
		fmt.Fprintf(c.out, "not injected: %s\n", m)
	}
	for _, f := range in.findings {
		v.fail("%s", f)
	}
	in.mu.Unlock()

	// Duplicates absorbed, per guard.
	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== duplicates absorbed, per guard ==")
	fmt.Fprintln(w, "guard\tkind\treason\tcount\t")
	rows, err = c.pool.Query(ctx, `SELECT guard, kind, reason, count FROM absorbed_duplicates ORDER BY guard, kind, reason`)
	if err != nil {
		return false, err
	}
	if err := forEach(rows, func(r pgx.Rows) error {
		var g, kind, reason string
		var cnt int64
		if err := r.Scan(&g, &kind, &reason, &cnt); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t\n", g, kind, reason, cnt)
		return nil
	}); err != nil {
		return false, err
	}
	fmt.Fprintf(w, "provider key\tsend_tickets\tsame key replayed by the provider\t%d\t\n", stats.Replayed)
	w.Flush()
	if stats.Conflicts != 0 {
		v.fail("the provider refused %d sends whose key had been used with another body", stats.Conflicts)
	}

	// Hosts.
	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== hosts ==")
	fmt.Fprintln(w, "host\tstarts\tfailed starts\texits not caused by chaos\tplugin restarts since last start\tunhealthy plugins\t")
	for _, h := range c.hosts {
		starts, fails, crashes := h.summary()
		restarts, unhealthy := 0, []string{}
		for _, ps := range hostStatus[h.name] {
			restarts += ps.Restarts
			if !ps.Healthy {
				unhealthy = append(unhealthy, ps.Name)
			}
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\t\n", h.name, starts, fails, len(crashes), restarts, strings.Join(unhealthy, ","))
		for _, cr := range crashes {
			v.fail("%s", cr)
		}
		if len(unhealthy) > 0 {
			v.fail("%s: plugin(s) %s marked unhealthy (crash loop)", h.name, strings.Join(unhealthy, ","))
		}
		if _, ok := hostStatus[h.name]; !ok {
			v.fail("%s did not answer /plugins at the end", h.name)
		}
	}
	w.Flush()
	for _, f := range probeFailures {
		v.fail("%s", f)
	}

	if err := c.checkCheckouts(ctx, w, &v); err != nil {
		return false, err
	}

	fmt.Fprintln(c.out)
	fmt.Fprintln(c.out, "== summary ==")
	fmt.Fprintln(w, "seed\t"+strconv.FormatUint(c.cfg.seed, 10)+"\t")
	fmt.Fprintf(w, "orders\t%d (confirmed %d, ambiguous commits %d), and %d paid checkouts\t\n", plainOrders, confirmed, ambiguous, paidCheckouts)
	fmt.Fprintf(w, "jobs\t%d outbox rows, %d stream entries\t\n", total.rows, streamLen)
	faultsTotal := 0
	for _, k := range c.cfg.faults {
		faultsTotal += in.counts[k]
	}
	fmt.Fprintf(w, "faults\t%d\t\n", faultsTotal)
	if c.cluster != nil {
		fmt.Fprintf(w, "redis\tcluster of 3 primaries and 3 replicas, %d stream shards\t\n", len(c.shards))
		// One row each: a long row would push every value of this
		// right-aligned table off the screen.
		fmt.Fprintf(w, "failovers\t%d\t\n", len(in.failovers))
		for i, f := range in.failovers {
			fmt.Fprintf(w, "  #%d %s (%d shard(s))\tpromoted %s, pause %s\t\n", i+1, f.primary, len(f.shards), dur(f.promoted), dur(f.pause))
		}
	}
	fmt.Fprintf(w, "load + faults\t%s\t\n", c.cfg.duration)
	fmt.Fprintf(w, "drain\t%s\t\n", drained.Round(100*time.Millisecond))
	fmt.Fprintf(w, "lost\t%d\t\n", v.lost)
	fmt.Fprintf(w, "doubled\t%d\t\n", v.dupes)
	w.Flush()
	fmt.Fprintln(c.out)
	if len(v.failures) > 0 {
		fmt.Fprintln(c.out, "FAILED:")
		for _, f := range v.failures {
			fmt.Fprintln(c.out, "  - "+f)
		}
		return false, nil
	}
	fmt.Fprintf(c.out, "OK: %d orders, %d faults, nothing lost, nothing doubled (seed %d, %s in all)\n",
		n, faultsTotal, c.cfg.seed, time.Since(loadStart).Round(time.Second))
	return true, nil
}

func (c *chaos) listUnaccounted(ctx context.Context) {
	rows, err := c.pool.Query(ctx, `
		SELECT o.id, o.kind, coalesce(o.job_id, o.id::text), o.payload::text, o.published_at IS NOT NULL
		FROM outbox o
		WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.job_id = coalesce(o.job_id, o.id::text))
		  AND CASE o.kind
		      WHEN 'update_sales_counter' THEN NOT EXISTS (SELECT 1 FROM counter_applies a WHERE a.job_id = coalesce(o.job_id, o.id::text))
		      WHEN 'render_tickets' THEN EXISTS (SELECT 1 FROM tickets t WHERE t.order_id = (o.payload->>'order_id')::bigint AND t.pdf_key IS NULL)
		      WHEN 'send_tickets' THEN NOT EXISTS (SELECT 1 FROM plugin_tickets.email_sends e WHERE e.order_id = (o.payload->>'order_id')::bigint AND e.sent_at IS NOT NULL)
		      WHEN 'reserve_seats' THEN NOT EXISTS (SELECT 1 FROM plugin_checkout.seat_holds h WHERE h.order_id = (o.payload->>'order_id')::bigint)
		      WHEN 'release_seats' THEN NOT EXISTS (SELECT 1 FROM plugin_checkout.seat_holds h WHERE h.order_id = (o.payload->>'order_id')::bigint AND h.released_at IS NOT NULL)
		      WHEN 'usher.workflow.checkout' THEN o.outcome IS DISTINCT FROM 'applied' AND o.outcome IS DISTINCT FROM 'absorbed'
		      ELSE true END
		ORDER BY o.id LIMIT 20`)
	if err != nil {
		fmt.Fprintf(c.out, "could not list them: %v\n", err)
		return
	}
	_ = forEach(rows, func(r pgx.Rows) error {
		var id int64
		var kind, job, payload string
		var published bool
		if err := r.Scan(&id, &kind, &job, &payload, &published); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "  unaccounted: outbox %d %s job %s %s published=%v\n", id, kind, job, payload, published)
		return nil
	})
}

func (c *chaos) listDeadLetters(ctx context.Context, v *verdict) {
	rows, err := c.pool.Query(ctx, `SELECT job_id, kind, reason, attempts FROM dead_letters ORDER BY id LIMIT 20`)
	if err != nil {
		v.fail("dead letters: %v", err)
		return
	}
	n := 0
	_ = forEach(rows, func(r pgx.Rows) error {
		var job, kind, reason string
		var attempts int
		if err := r.Scan(&job, &kind, &reason, &attempts); err != nil {
			return err
		}
		n++
		fmt.Fprintf(c.out, "  dead letter: %s job %s after %d attempt(s): %s\n", kind, job, attempts, reason)
		return nil
	})
	if n > 0 {
		v.fail("%d+ dead letters (expected none: every fault chaos injects is transient)", n)
	}
}

func forEach(rows pgx.Rows, fn func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// checkOutcomes reads the host's own ledger, when the schema has one: the
// outcome each outbox row's job ended with, written before the ack. A
// published row without one is a job the hosts never finished.
func (c *chaos) checkOutcomes(ctx context.Context, v *verdict) error {
	var has bool
	if err := c.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'outbox' AND column_name = 'outcome')`).Scan(&has); err != nil || !has {
		return err
	}
	rows, err := c.pool.Query(ctx, `SELECT coalesce(outcome, '(none)'), count(*) FROM outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return err
	}
	var parts []string
	if err := forEach(rows, func(r pgx.Rows) error {
		var o string
		var n int64
		if err := r.Scan(&o, &n); err != nil {
			return err
		}
		parts = append(parts, fmt.Sprintf("%s %d", o, n))
		if o == "(none)" {
			v.fail("%d outbox rows have no outcome recorded by a host", n)
		}
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "outcomes the hosts recorded on the outbox rows: %s\n", strings.Join(parts, ", "))
	return nil
}

// sentLog reads the provider's whole sent log. Not mail.Client.Messages: it
// reads at most 1 MiB of an answer, about 4,000 messages.
func (c *chaos) sentLog(ctx context.Context) ([]mail.SentMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.mailURL+"/_admin/messages", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("mail provider sent log: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Count    int                `json:"count"`
		Messages []mail.SentMessage `json:"messages"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("mail provider sent log: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("mail provider sent log: %w", err)
	}
	if out.Count != len(out.Messages) {
		return nil, fmt.Errorf("mail provider sent log: count %d, %d messages", out.Count, len(out.Messages))
	}
	return out.Messages, nil
}

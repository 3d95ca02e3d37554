package host_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/workflow"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/plugins/tickets/mail"
)

// checkouts is a host serving the shipped plugins' chaos builds (counters,
// tickets, checkout) from a plugin directory with their manifests
// (hosttest.ChaosPlugins), beside a mail provider, on its own database and
// stream.
type checkouts struct {
	*testBundle
	cfg    host.Config
	h      *hosttest.Running
	mailer *mail.Client
	event  int64
}

func startCheckouts(t *testing.T) *checkouts {
	t.Helper()
	b := setup(t)
	dir, work := hosttest.ChaosPlugins(t), t.TempDir()
	mailURL := hosttest.MailProvider(t)
	c := &checkouts{testBundle: b, mailer: &mail.Client{BaseURL: mailURL, HTTP: &http.Client{Timeout: 5 * time.Second}}}
	c.cfg = b.config()
	c.cfg.Plugins, c.cfg.PluginDir, c.cfg.DisablePluginWatch = nil, dir, true
	c.cfg.RetryBackoff, c.cfg.PluginCrashLoop = 200*time.Millisecond, 50
	c.cfg.PluginEnv = append(c.cfg.PluginEnv, "USHER_BLOB_DIR="+filepath.Join(work, "blobs"), "MAILPROVIDER_URL="+mailURL,
		"TICKETS_CLAIM_LEASE=2s")
	c.h = hosttest.Start(t, c.cfg)
	var err error
	c.event, err = orders.CreateEvent(context.Background(), b.pool, "Floating Points", "Printworks")
	require.NoError(t, err)
	return c
}

func (c *checkouts) place(t *testing.T, seats int, payWithin time.Duration) orders.Checkout {
	t.Helper()
	o, err := orders.PlaceCheckout(context.Background(), c.pool, orders.Order{EventID: c.event, Buyer: "Buyer",
		Email: "b@example.com", Seats: seats}, payWithin)
	require.NoError(t, err)
	return o
}

func (c *checkouts) state(t *testing.T, o orders.Checkout) (state, result string) {
	t.Helper()
	var r *string
	require.NoError(t, c.pool.QueryRow(context.Background(), `SELECT state, result::text FROM workflows WHERE id = $1`, o.Workflow).
		Scan(&state, &r))
	if r != nil {
		result = *r
	}
	return state, result
}

func (c *checkouts) waitState(t *testing.T, o orders.Checkout, want string) {
	t.Helper()
	hosttest.Eventually(t, 90*time.Second, "checkout "+o.PublicID+" "+want, func() bool {
		s, _ := c.state(t, o)
		return s == want
	})
}

// checkoutEffects is everything a checkout does, counted for its order.
type checkoutEffects struct {
	Reserved, Released    int64 // seat_moves rows: holds, releases
	Held                  int64 // the order's seats in events.seats_held, by its moves
	PDFs, Emails, SentRow int64 // tickets with a stored PDF's key, messages at the provider, email_sends marked
	Counted               int64 // counter_applies rows
	SendQueued            int64 // send_tickets outbox rows (first runs)
}

func (c *checkouts) effects(t *testing.T, o orders.Checkout) checkoutEffects {
	t.Helper()
	var e checkoutEffects
	require.NoError(t, c.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM plugin_checkout.seat_moves WHERE order_id = $1 AND delta > 0),
		(SELECT count(*) FROM plugin_checkout.seat_moves WHERE order_id = $1 AND delta < 0),
		(SELECT coalesce(sum(delta), 0) FROM plugin_checkout.seat_moves WHERE order_id = $1),
		(SELECT count(DISTINCT order_id) FROM tickets WHERE order_id = $1 AND pdf_key IS NOT NULL),
		(SELECT count(*) FROM plugin_tickets.email_sends WHERE order_id = $1 AND sent_at IS NOT NULL),
		(SELECT count(*) FROM counter_applies WHERE order_id = $1),
		(SELECT count(*) FROM outbox WHERE kind = 'send_tickets' AND job_id IS NULL AND payload->>'order_id' = $1::text)`, o.ID).
		Scan(&e.Reserved, &e.Released, &e.Held, &e.PDFs, &e.SentRow, &e.Counted, &e.SendQueued))
	msgs, err := c.mailer.Messages(context.Background())
	require.NoError(t, err)
	for _, m := range msgs {
		if m.IdempotencyKey == "tickets-"+strconv.FormatInt(o.ID, 10) {
			e.Emails++
		}
	}
	return e
}

// requireDecidedOnce: no decision task of the checkout decided twice, none
// applied without its decision recorded, no step scheduled twice.
func (c *checkouts) requireDecidedOnce(t *testing.T, o orders.Checkout) {
	t.Helper()
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM (SELECT task_job FROM workflow_decisions WHERE workflow = $1
		GROUP BY task_job HAVING count(*) > 1) x`, o.Workflow), "a decision task decided twice")
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM outbox o WHERE o.workflow = $1 AND o.kind = 'usher.workflow.checkout'
		AND o.outcome = 'applied' AND NOT EXISTS (SELECT 1 FROM workflow_decisions d WHERE d.workflow = $1 AND d.task_job = o.id::text)`,
		o.Workflow), "a task applied without its decision recorded")
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM (SELECT name FROM workflow_events WHERE workflow = $1
		AND type = 'step_scheduled' GROUP BY name HAVING count(*) > 1) x`, o.Workflow), "a step scheduled twice")
}

func (c *checkouts) seatsHeld(t *testing.T) int64 {
	t.Helper()
	return hosttest.Count(t, c.pool, `SELECT seats_held FROM events WHERE id = $1`, c.event)
}

// A paid checkout on the real plugin processes: its seats reserved once,
// the payment (confirmed twice, counted once) sent from the application's
// transaction, the render and the count at once, then the send: one PDF,
// one email, one count, and the seats still held. A relay duplicate of
// every row of the checkout (its decision tasks and its steps) is
// absorbed: nothing doubled, no decision taken twice.
func TestCheckoutPaidCompletes(t *testing.T) {
	t.Parallel()
	c := startCheckouts(t)
	ctx := context.Background()
	o := c.place(t, 3, time.Minute)
	hosttest.Eventually(t, 60*time.Second, "the seats held", func() bool { return c.effects(t, o).Reserved == 1 })
	added, err := orders.ConfirmPayment(ctx, c.pool, o.ID, o.PublicID, "pay-"+o.PublicID)
	require.NoError(t, err)
	require.True(t, added)
	added, err = orders.ConfirmPayment(ctx, c.pool, o.ID, o.PublicID, "pay-"+o.PublicID)
	require.NoError(t, err)
	require.False(t, added, "a payment confirmed twice counts once")

	c.waitState(t, o, "completed")
	want := checkoutEffects{Reserved: 1, Held: 3, PDFs: 1, Emails: 1, SentRow: 1, Counted: 1, SendQueued: 1}
	require.Equal(t, want, c.effects(t, o))
	_, result := c.state(t, o)
	require.JSONEq(t, `{"order_id": `+strconv.FormatInt(o.ID, 10)+`, "payment": "pay-`+o.PublicID+`"}`, result)
	require.EqualValues(t, 3, c.seatsHeld(t))
	require.EqualValues(t, 3, hosttest.Count(t, c.pool, `SELECT seats_sold FROM events WHERE id = $1`, c.event))
	// The render and the count were scheduled by one decision (fan-out),
	// the send by the next after both ended (fan-in).
	require.EqualValues(t, 1, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_decisions WHERE workflow = $1 AND steps = 2`, o.Workflow))
	require.EqualValues(t, 2, hosttest.Count(t, c.pool, `SELECT max(scheduled_seq) - min(scheduled_seq) + 1 FROM workflow_steps
		WHERE workflow = $1 AND step IN ('render', 'count')`, o.Workflow), "recorded one after the other")
	require.EqualValues(t, 1, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_steps s WHERE s.workflow = $1 AND s.step = 'send'
		AND s.scheduled_seq > ALL (SELECT e.seq FROM workflow_events e WHERE e.workflow = $1 AND e.type = 'step_completed'
		AND e.name IN ('render', 'count'))`, o.Workflow))
	c.requireDecidedOnce(t, o)
	decisions := hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_decisions WHERE workflow = $1`, o.Workflow)

	_, err = c.pool.Exec(ctx, `UPDATE outbox SET published_at = NULL, done_at = NULL, outcome = NULL WHERE workflow = $1`, o.Workflow)
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the redelivered rows absorbed", func() bool {
		return hosttest.Count(t, c.pool, `SELECT count(*) FROM outbox WHERE workflow = $1 AND outcome IS DISTINCT FROM 'absorbed'`, o.Workflow) == 0
	})
	require.Equal(t, want, c.effects(t, o))
	require.Equal(t, decisions, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_decisions WHERE workflow = $1`, o.Workflow))
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM dead_letters`))
}

// A checkout never paid: its timer fires after the hold, the seats are
// released once (the compensation) and it ends cancelled with the cause;
// nothing is rendered, counted or sent. A payment that comes after is
// refused with a clear error, and rolls back with its transaction.
func TestCheckoutTimesOutAndReleases(t *testing.T) {
	t.Parallel()
	c := startCheckouts(t)
	o := c.place(t, 2, 1500*time.Millisecond)
	c.waitState(t, o, "cancelled")
	require.Equal(t, checkoutEffects{Reserved: 1, Released: 1}, c.effects(t, o))
	_, result := c.state(t, o)
	require.JSONEq(t, `{"order_id": `+strconv.FormatInt(o.ID, 10)+`, "cause": "payment_timeout", "released": true}`, result)
	require.Zero(t, c.seatsHeld(t))
	require.EqualValues(t, 1, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_timers WHERE workflow = $1 AND fired_at IS NOT NULL`, o.Workflow))
	c.requireDecidedOnce(t, o)

	_, err := orders.ConfirmPayment(context.Background(), c.pool, o.ID, o.PublicID, "late")
	require.ErrorContains(t, err, "checkout workflow "+o.PublicID+" is cancelled, not running")
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM payments`), "the late payment rolled back with the refused signal")
}

// A checkout cancelled once its seats are held releases them once and ends
// cancelled with the reason; a second cancel request records nothing.
func TestCheckoutCancelledReleases(t *testing.T) {
	t.Parallel()
	c := startCheckouts(t)
	o := c.place(t, 4, time.Hour)
	hosttest.Eventually(t, 60*time.Second, "the seats held", func() bool { return c.effects(t, o).Reserved == 1 })
	require.EqualValues(t, 4, c.seatsHeld(t))
	asked, err := orders.CancelCheckout(context.Background(), c.pool, o.PublicID, "buyer left")
	require.NoError(t, err)
	require.True(t, asked)
	if asked, err = orders.CancelCheckout(context.Background(), c.pool, o.PublicID, "again"); err == nil {
		require.False(t, asked)
	}
	c.waitState(t, o, "cancelled")
	require.Equal(t, checkoutEffects{Reserved: 1, Released: 1}, c.effects(t, o))
	_, result := c.state(t, o)
	require.JSONEq(t, `{"order_id": `+strconv.FormatInt(o.ID, 10)+`, "cause": "cancel_requested", "reason": "buyer left", "released": true}`, result)
	require.Zero(t, c.seatsHeld(t))
	c.requireDecidedOnce(t, o)
}

// Steps interrupted at their worst points: every reserve and release
// crashes its plugin after its commit phase (the won write rolled back with
// the dead process), every render after storing the PDF, every send after
// the provider accepted the email (before sent_at), and the counters
// plugin is killed with -9 while it holds each count. Each job runs again
// once its plugin is back: two paid checkouts, one timed out and one
// cancelled end as they should, each effect once.
func TestCheckoutStepsCrashedMidStepDoubleNothing(t *testing.T) {
	t.Parallel()
	c := startCheckouts(t)
	ctx := context.Background()
	for _, point := range []string{"reserve.after_commit", "release.after_commit", "render.after_prepare", "send.after_effect"} {
		require.NoError(t, faults.Arm(c.faultDir, point, faults.Spec{Action: "crash", Once: true}))
	}
	require.NoError(t, faults.Arm(c.faultDir, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h", Once: true}))
	stop := make(chan struct{})
	defer close(stop)
	kills := make(chan int, 8)
	go killHolders(c.faultDir, "counter.before_apply", stop, kills)

	paid := []orders.Checkout{c.place(t, 1, time.Minute), c.place(t, 2, time.Minute)}
	late := c.place(t, 3, 2*time.Second)
	gone := c.place(t, 5, time.Hour)
	for _, o := range paid {
		_, err := orders.ConfirmPayment(ctx, c.pool, o.ID, o.PublicID, "pay-"+o.PublicID)
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 60*time.Second, "the cancelled checkout's seats held", func() bool { return c.effects(t, gone).Reserved == 1 })
	_, err := orders.CancelCheckout(ctx, c.pool, gone.PublicID, "buyer left")
	require.NoError(t, err)

	for _, o := range paid {
		c.waitState(t, o, "completed")
	}
	c.waitState(t, late, "cancelled")
	c.waitState(t, gone, "cancelled")
	for _, o := range paid {
		require.Equal(t, checkoutEffects{Reserved: 1, Held: int64(o.Seats), PDFs: 1, Emails: 1, SentRow: 1, Counted: 1, SendQueued: 1},
			c.effects(t, o), o.PublicID)
		c.requireDecidedOnce(t, o)
	}
	for _, o := range []orders.Checkout{late, gone} {
		require.Equal(t, checkoutEffects{Reserved: 1, Released: 1}, c.effects(t, o), o.PublicID)
		c.requireDecidedOnce(t, o)
	}
	require.EqualValues(t, 3, c.seatsHeld(t), "the paid checkouts' 1 + 2 seats")
	// Every fault fired, for every job it was armed for.
	require.Len(t, hits(t, c.faultDir, "reserve.after_commit"), 4)
	require.Len(t, hits(t, c.faultDir, "release.after_commit"), 2)
	require.Len(t, hits(t, c.faultDir, "render.after_prepare"), 2)
	require.Len(t, hits(t, c.faultDir, "send.after_effect"), 2)
	require.Len(t, hits(t, c.faultDir, "counter.before_apply"), 2)
	require.Len(t, kills, 2, "the counters plugin killed while it held each count")
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM dead_letters`))
}

// The host stopped while checkouts sleep on their payment timers, started
// again after they were due: each timer fires once, each checkout releases
// its seats once.
func TestCheckoutTimersSurviveHostRestart(t *testing.T) {
	t.Parallel()
	c := startCheckouts(t)
	var sleeping []orders.Checkout
	for range 5 {
		sleeping = append(sleeping, c.place(t, 1, 3*time.Second))
	}
	hosttest.Eventually(t, 60*time.Second, "every checkout's seats held and its timer set", func() bool {
		return hosttest.Count(t, c.pool, `SELECT count(*) FROM plugin_checkout.seat_holds`) == 5 &&
			hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_timers WHERE fired_at IS NULL`) == 5
	})
	require.NoError(t, c.h.Stop())
	hosttest.Eventually(t, 30*time.Second, "every timer due", func() bool {
		return hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_timers WHERE fire_at > now()`) == 0
	})
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_timers WHERE fired_at IS NOT NULL`), "no host, no timer fired")
	c.h = hosttest.Start(t, c.cfg)
	for _, o := range sleeping {
		c.waitState(t, o, "cancelled")
		require.Equal(t, checkoutEffects{Reserved: 1, Released: 1}, c.effects(t, o))
		require.EqualValues(t, 1, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_events WHERE workflow = $1 AND type = 'timer_fired'`, o.Workflow))
		c.requireDecidedOnce(t, o)
	}
	require.Zero(t, c.seatsHeld(t))
}

// killHolders kills with -9 every process that writes a hit at point (a
// stalled job), once per hit, until stop.
func killHolders(dir, point string, stop <-chan struct{}, kills chan<- int) {
	done := map[string]bool{}
	for {
		select {
		case <-stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
		m, _ := filepath.Glob(filepath.Join(dir, point+".*.hit"))
		for _, f := range m {
			if done[f] {
				continue
			}
			raw, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil {
				continue
			}
			done[f] = true
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				kills <- pid
			}
		}
	}
}

func hits(t *testing.T, dir, point string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, point+".*.hit"))
	require.NoError(t, err)
	return m
}

// A hot swap under 1,000 checkouts: 500 started on checkout 1.0.0 keep
// being decided by 1.0.0 (run beside 2.0.0 under the same role) after the
// swap, the 500 started after it are decided by 2.0.0, twenty old ones
// are moved to 2.0.0 explicitly (host workflows migrate) and decided there
// from then on; every checkout completes, paid, with each effect once.
func TestCheckoutHotSwapUnderAThousand(t *testing.T) {
	t.Parallel()
	c := startCheckouts(t)
	ctx := context.Background()
	const half, moved = 500, 20
	all := make([]orders.Checkout, 0, 2*half)
	place := func(n int) {
		for range n {
			all = append(all, c.place(t, 1, time.Hour))
		}
	}
	pinned := func(version string) int64 {
		return hosttest.Count(t, c.pool, `SELECT count(*) FROM workflows WHERE type = 'checkout' AND plugin_version = $1`, version)
	}
	place(half)
	hosttest.Eventually(t, 180*time.Second, "500 checkouts pinned to 1.0.0", func() bool { return pinned("1.0.0") == half })

	hosttest.InstallChaosPlugin(t, c.cfg.PluginDir, "checkout", "2.0.0")
	res, err := c.h.Host.Reload(ctx, "checkout")
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, "swapped", res[0].Action, res[0].Error)
	require.Equal(t, "2.0.0", res[0].To)
	place(half)
	hosttest.Eventually(t, 180*time.Second, "500 checkouts pinned to 2.0.0", func() bool { return pinned("2.0.0") == half })

	pay := func(list []orders.Checkout) {
		for _, o := range list {
			_, err := orders.ConfirmPayment(ctx, c.pool, o.ID, o.PublicID, "pay-"+o.PublicID)
			require.NoError(t, err)
		}
	}
	completed := func() int64 {
		return hosttest.Count(t, c.pool, `SELECT count(*) FROM workflows WHERE type = 'checkout' AND state = 'completed'`)
	}
	pay(all[moved:])
	hosttest.Eventually(t, 300*time.Second, "980 checkouts completed", func() bool { return completed() == 2*half-moved })
	require.Equal(t, []string{"checkout@1.0.0"}, c.h.Host.PinnedVersions())

	ids := make([]string, 0, moved)
	for _, o := range all[:moved] {
		ids = append(ids, o.PublicID)
	}
	mres, err := c.h.Host.MigrateWorkflows(ctx, workflow.MigrateRequest{Type: "checkout", From: "1.0.0", IDs: ids})
	require.NoError(t, err)
	require.Len(t, mres.Migrated, moved, "refused: %v", mres.Refused)
	pay(all[:moved])
	hosttest.Eventually(t, 120*time.Second, "every checkout completed", func() bool { return completed() == 2*half })

	// Effects, all at once: every order held its seat once and never
	// released it, has its PDF, its count and its send once.
	require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflows w JOIN orders o ON o.public_id = w.workflow_id
		WHERE w.type = 'checkout' AND (
			(SELECT count(*) FROM plugin_checkout.seat_moves m WHERE m.order_id = o.id AND m.delta > 0) <> 1
			OR EXISTS (SELECT 1 FROM plugin_checkout.seat_moves m WHERE m.order_id = o.id AND m.delta < 0)
			OR (SELECT count(*) FROM counter_applies a WHERE a.order_id = o.id) <> 1
			OR (SELECT count(*) FROM plugin_tickets.email_sends s WHERE s.order_id = o.id AND s.sent_at IS NOT NULL) <> 1
			OR NOT EXISTS (SELECT 1 FROM tickets k WHERE k.order_id = o.id AND k.pdf_key IS NOT NULL))`),
		"a checkout's effect lost or doubled")
	require.EqualValues(t, 2*half, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflows w JOIN orders o ON o.public_id = w.workflow_id
		WHERE w.type = 'checkout'`))
	msgs, err := c.mailer.Messages(ctx)
	require.NoError(t, err)
	sent := map[string]int{}
	for _, m := range msgs {
		sent[m.IdempotencyKey]++
	}
	for _, o := range all {
		require.Equal(t, 1, sent["tickets-"+strconv.FormatInt(o.ID, 10)], "order %d's emails at the provider", o.ID)
	}
	// Versions: the old ones on 1.0.0 only, the new ones on 2.0.0 only,
	// the moved ones on 2.0.0 after their migrated event.
	on := func(o orders.Checkout, version string) int64 {
		return hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_decisions WHERE workflow = $1 AND plugin_version = $2`, o.Workflow, version)
	}
	for i, o := range all {
		c.requireDecidedOnce(t, o)
		switch {
		case i < moved:
			require.NotZero(t, on(o, "2.0.0"), "moved checkout %s", o.PublicID)
			require.Zero(t, hosttest.Count(t, c.pool, `SELECT count(*) FROM workflow_decisions d WHERE d.workflow = $1 AND d.plugin_version = '1.0.0'
				AND d.seq > (SELECT seq FROM workflow_events e WHERE e.workflow = $1 AND e.type = 'migrated')`, o.Workflow),
				"moved checkout %s decided by 1.0.0 after it moved", o.PublicID)
		case i < half:
			require.Zero(t, on(o, "2.0.0"), "checkout %s started on 1.0.0 was decided by 2.0.0", o.PublicID)
		default:
			require.Zero(t, on(o, "1.0.0"), "checkout %s started on 2.0.0 was decided by 1.0.0", o.PublicID)
		}
	}
}

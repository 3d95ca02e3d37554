package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/internal/mailproc"
	"github.com/usherhq/usher/internal/procstat"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/mail"
	"github.com/usherhq/usher/plugins/tickets/render"
)

// mixResult is the full Stagedoor mix: orders whose jobs render the
// tickets' PDF, send them by mail and count the seats, against the same
// PDFs rendered and stored alone (the handlers' own work), in this process,
// in the same run.
type mixResult struct {
	Orders  int     `json:"orders"`
	Seconds float64 `json:"seconds"`
	// CPUSeconds is the host's and both plugins' CPU over the mix (the
	// mail provider, which stands in for a service outside our network,
	// is not counted; MailProviderCPUSeconds is).
	CPUSeconds             float64      `json:"cpu_seconds"`
	Plugins                []procResult `json:"plugins"`
	MailProviderCPUSeconds float64      `json:"mail_provider_cpu_seconds"`
	// RenderAloneCPUSeconds renders and stores the same orders' PDFs with
	// no runtime around them.
	RenderAloneCPUSeconds float64 `json:"render_alone_cpu_seconds"`
	// Overhead is CPUSeconds / RenderAloneCPUSeconds - 1: what the runtime
	// (relay, stream, guards, plugin boundary, mail, counting) adds.
	Overhead float64 `json:"overhead"`
	Sent     int64   `json:"sent"`
	Counted  int64   `json:"counted"`
	// Messages is what the mail provider holds: one per order, or an
	// email was lost (fewer) or doubled (more).
	Messages     int   `json:"messages"`
	LostEmails   int64 `json:"lost_emails"`
	DoubledMails int64 `json:"doubled_emails"`
	check
}

// measureMix places cfg.Mix orders with all their jobs on a host serving
// both plugins and a mail provider process, waits until every email is
// marked sent and every order counted, then renders the same orders' PDFs
// alone.
func measureMix(ctx context.Context, cfg config, db *database, pluginDir string, logger *slog.Logger, p *progress) (*mixResult, string, error) {
	res := &mixResult{Orders: cfg.Mix}
	work, err := os.MkdirTemp("", "usher-bench-mix-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(work)
	mp, err := mailproc.Start(cfg.MailProvider, filepath.Join(work, "mail"), nil)
	if err != nil {
		return nil, "", err
	}
	defer mp.Stop()
	id := suffix()
	stream := "usher:bench:mix:{" + id + "}"
	h, err := host.New(ctx, host.Config{
		DatabaseURL: db.ownerURL, RedisURL: cfg.RedisURL, Stream: stream, Group: group, Consumer: "bench-mix-" + id,
		PluginDir: pluginDir, DisablePluginWatch: true, Logger: logger,
		PluginEnv: []string{"USHER_BLOB_DIR=" + filepath.Join(work, "blobs"), "MAILPROVIDER_URL=" + mp.URL},
	})
	if err != nil {
		return nil, stream, fmt.Errorf("start host: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Run(runCtx) }()
	stop := func() error {
		cancel()
		err := <-done
		h.Close()
		return err
	}
	evs, err := createEvents(ctx, db.pool, "mix", 10)
	if err != nil {
		return nil, stream, errors.Join(err, stop())
	}
	// Every order in one transaction, the samples taken just before it
	// commits: the clock and the CPU count from the outbox commit.
	var before sample
	var mailBefore time.Duration
	var ids []int64
	var counterJobs []string // each order's update_sales_counter job id, its first outbox row
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		for i := range cfg.Mix {
			placed, err := orders.PlaceTx(ctx, tx, workloadOrder(int64(i), evs), orders.Jobs{Tickets: true, Counter: true})
			if err != nil {
				return err
			}
			ids = append(ids, placed.ID)
			counterJobs = append(counterJobs, strconv.FormatInt(placed.OutboxIDs[0], 10))
		}
		before, mailBefore = takeSample(h), cpuOrZero(mp.Pid())
		return nil
	})
	if err != nil {
		return nil, stream, errors.Join(err, stop())
	}
	start := time.Now()
	stopProfile, err := startProfileAs(cfg, "host-mix.pprof")
	if err != nil {
		return nil, stream, errors.Join(err, stop())
	}
	p.phase(fmt.Sprintf("mix: %d orders (render, send, count)", cfg.Mix), int64(cfg.Mix))
	for {
		res.Sent = count(ctx, db.pool, `SELECT count(*) FROM plugin_tickets.email_sends WHERE sent_at IS NOT NULL AND order_id = ANY($1)`, ids)
		res.Counted = count(ctx, db.pool, `SELECT count(*) FROM processed_jobs WHERE job_id = ANY($1)`, counterJobs)
		p.set(min(res.Sent, res.Counted))
		if res.Sent == int64(cfg.Mix) && res.Counted == int64(cfg.Mix) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, stream, errors.Join(fmt.Errorf("mix: %d sent, %d counted of %d: %w", res.Sent, res.Counted, cfg.Mix, context.Cause(ctx)), stopProfile(), stop())
		case <-time.After(50 * time.Millisecond):
		}
	}
	res.Seconds = time.Since(start).Seconds()
	after, mailAfter := takeSample(h), cpuOrZero(mp.Pid())
	if err := stopProfile(); err != nil {
		return nil, stream, errors.Join(err, stop())
	}
	var lr levelResult
	lr.usage(before, after)
	res.CPUSeconds, res.Plugins = lr.CPUSeconds, lr.Plugins
	res.MailProviderCPUSeconds = (mailAfter - mailBefore).Seconds()
	if err := stop(); err != nil {
		return nil, stream, err
	}
	msgs, err := (&mail.Client{BaseURL: mp.URL}).Messages(ctx)
	if err != nil {
		return nil, stream, fmt.Errorf("read the mail provider's messages: %w", err)
	}
	res.Messages = len(msgs)
	res.LostEmails, res.DoubledMails = max(int64(cfg.Mix-len(msgs)), 0), max(int64(len(msgs)-cfg.Mix), 0)
	if res.check, err = verify(ctx, db.pool, evs); err != nil {
		return nil, stream, err
	}

	p.phase(fmt.Sprintf("mix: rendering the %d orders' PDFs alone", cfg.Mix), int64(cfg.Mix))
	res.RenderAloneCPUSeconds, err = renderAlone(ctx, db.pool, ids, filepath.Join(work, "alone"), p)
	if err != nil {
		return nil, stream, err
	}
	if res.RenderAloneCPUSeconds > 0 {
		res.Overhead = res.CPUSeconds/res.RenderAloneCPUSeconds - 1
	}
	return res, stream, nil
}

// renderAlone renders and stores each order's PDF as the render handler
// does (the same query's data, render.PDF, a blob store put), with nothing
// else running in this process, and returns the CPU it took.
func renderAlone(ctx context.Context, pool *pgxpool.Pool, ids []int64, dir string, p *progress) (float64, error) {
	store, err := blob.NewFS(dir)
	if err != nil {
		return 0, err
	}
	var todo []render.Order
	for _, id := range ids {
		var o render.Order
		err := pool.QueryRow(ctx, `
			SELECT o.id, o.public_id, e.name, e.venue, e.starts_at, o.buyer, o.email, o.created_at
			FROM orders o JOIN events e ON e.id = o.event_id WHERE o.id = $1`, id).
			Scan(&o.ID, &o.PublicID, &o.EventName, &o.Venue, &o.StartsAt, &o.Buyer, &o.Email, &o.CreatedAt)
		if err != nil {
			return 0, err
		}
		rows, err := pool.Query(ctx, `SELECT id, code, seat FROM tickets WHERE order_id = $1 ORDER BY id`, id)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			var t render.Ticket
			if err := rows.Scan(&t.ID, &t.Code, &t.Seat); err != nil {
				rows.Close()
				return 0, err
			}
			o.Tickets = append(o.Tickets, t)
		}
		rows.Close()
		o.StartsAt = o.StartsAt.UTC()
		todo = append(todo, o)
	}
	before := procstat.SelfCPU()
	for i, o := range todo {
		pdf, err := render.PDF(o)
		if err != nil {
			return 0, err
		}
		if err := store.Put(ctx, fmt.Sprintf("alone/%d.pdf", o.ID), pdf); err != nil {
			return 0, err
		}
		p.set(int64(i + 1))
	}
	return (procstat.SelfCPU() - before).Seconds(), nil
}

func count(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) int64 {
	var n int64
	_ = pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n
}

func cpuOrZero(pid int) time.Duration {
	d, _ := procstat.CPU(pid)
	return d
}

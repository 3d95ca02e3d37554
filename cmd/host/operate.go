package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/deadletter"
)

func connect(ctx context.Context, c *connFlags) (*pgxpool.Pool, *redis.Client, error) {
	pool, err := pgxpool.New(ctx, c.databaseURL)
	if err != nil {
		return nil, nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("postgres unreachable: %w", err)
	}
	opt, err := host.RedisOptions(c.redisURL, c.redisCAFile)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, redis.NewClient(opt), nil
}

func cmdInspect(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	conn := &connFlags{}
	conn.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, rdb, err := connect(ctx, conn)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer rdb.Close()
	return inspect(ctx, os.Stdout, pool, rdb, conn.stream, conn.group)
}

func inspect(ctx context.Context, out *os.File, pool *pgxpool.Pool, rdb redis.UniversalClient, stream, group string) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "stream\t%s (group %s)\n", stream, group)
	if n, err := rdb.XLen(ctx, stream).Result(); err == nil {
		fmt.Fprintf(w, "  entries\t%d\n", n)
	}
	if p, err := rdb.XPending(ctx, stream, group).Result(); err == nil {
		fmt.Fprintf(w, "  pending\t%d\n", p.Count)
		for c, n := range p.Consumers {
			fmt.Fprintf(w, "    %s\t%d\n", c, n)
		}
	} else {
		fmt.Fprintf(w, "  pending\t(no group: %v)\n", err)
	}
	var unpublished, due, later, processed int64
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox WHERE published_at IS NULL),
		(SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL AND run_at <= now()),
		(SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL AND run_at > now()),
		(SELECT count(*) FROM processed_jobs)`).Scan(&unpublished, &due, &later, &processed); err != nil {
		return err
	}
	fmt.Fprintf(w, "outbox unpublished\t%d\n", unpublished)
	fmt.Fprintf(w, "scheduled runs\t%d due, %d later\n", due, later)
	fmt.Fprintf(w, "processed job ids\t%d\n", processed)
	rows, err := pool.Query(ctx, `SELECT kind, count(*) FROM dead_letters WHERE requeued_at IS NULL GROUP BY kind ORDER BY kind`)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "dead letters (open)\n")
	if err := forEach(rows, func(r pgx.Rows) error {
		var kind string
		var n int64
		if err := r.Scan(&kind, &n); err != nil {
			return err
		}
		fmt.Fprintf(w, "  %s\t%d\n", kind, n)
		return nil
	}); err != nil {
		return err
	}
	rows, err = pool.Query(ctx, `SELECT guard, kind, reason, count FROM absorbed_duplicates ORDER BY guard, kind, reason`)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "duplicates absorbed\tguard\tkind\treason\n")
	return forEach(rows, func(r pgx.Rows) error {
		var g, kind, reason string
		var n int64
		if err := r.Scan(&g, &kind, &reason, &n); err != nil {
			return err
		}
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\n", n, g, kind, reason)
		return nil
	})
}

func forEach(rows pgx.Rows, f func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func cmdDeadLetters(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("deadletters", flag.ContinueOnError)
	conn := &connFlags{}
	conn.register(fs)
	kind := fs.String("kind", "", "only this kind (list), or requeue every open letter of this kind")
	limit := fs.Int("limit", 50, "how many to list")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host deadletters [flags] list | show ID | requeue ID | requeue --kind KIND")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("deadletters needs a subcommand")
	}
	pool, rdb, err := connect(ctx, conn)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer rdb.Close()
	switch rest[0] {
	case "list":
		letters, err := deadletter.List(ctx, pool, *kind, *limit)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tJOB\tKIND\tATTEMPTS\tAGE\tREASON")
		for _, l := range letters {
			fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\n", l.ID, l.JobID, l.Kind, l.Attempts,
				time.Since(l.CreatedAt).Round(time.Second), truncate(l.Reason, 100))
		}
		w.Flush()
		if len(letters) == 0 {
			fmt.Println("no open dead letters")
		}
		return nil
	case "show":
		id, err := idArg(rest)
		if err != nil {
			return err
		}
		l, err := deadletter.Get(ctx, pool, id)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		out := map[string]any{
			"id": l.ID, "job_id": l.JobID, "kind": l.Kind, "payload": showBytes(l.Payload, len(l.Payload)),
			"request_id": l.RequestID, "trace": l.Trace, "reason": l.Reason, "last_error": l.LastError,
			"attempts": l.Attempts, "stream_id": l.StreamID, "history": l.History,
			"created_at": l.CreatedAt, "requeued_at": l.RequeuedAt,
		}
		if l.Raw != nil {
			out["raw"] = showRaw(l.Raw)
		}
		return enc.Encode(out)
	case "requeue":
		var id int64
		if *kind == "" {
			if id, err = idArg(rest); err != nil {
				return err
			}
		}
		var n int
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err = deadletter.Requeue(ctx, tx, id, *kind)
			return err
		})
		if err != nil {
			return err
		}
		fmt.Printf("requeued %d dead letter(s) through the outbox, identities kept\n", n)
		return nil
	default:
		fs.Usage()
		return fmt.Errorf("unknown deadletters subcommand %q", rest[0])
	}
}

// rawShown is one field of a letter's raw entry as `deadletters show`
// prints it.
type rawShown struct {
	Field string `json:"field"`
	Value string `json:"value"`
	// Bytes is the value's full length; Cut says only a prefix of it was
	// read (the entry was oversized) or is shown.
	Bytes int  `json:"bytes"`
	Cut   bool `json:"cut,omitempty"`
}

// showRawBytes bounds how much of a raw value show prints.
const showRawBytes = 256

func showRaw(fields []deadletter.RawField) []rawShown {
	out := make([]rawShown, 0, len(fields))
	for _, f := range fields {
		out = append(out, rawShown{Field: showBytes(f.Name, f.NameBytes), Value: showBytes(truncBytes(f.Value, showRawBytes), f.ValueBytes),
			Bytes: f.ValueBytes, Cut: f.ValueBytes > min(len(f.Value), showRawBytes)})
	}
	return out
}

func truncBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// showBytes prints b as text when it is valid UTF-8 with no NUL byte, else
// Go-quoted (a byte that is not UTF-8 reads \xff); full, its full length,
// notes that b is a prefix.
func showBytes(b []byte, full int) string {
	s := deadletter.Text(string(b))
	if full > len(b) {
		s += fmt.Sprintf("… (%d of %d bytes)", len(b), full)
	}
	return s
}

func idArg(rest []string) (int64, error) {
	if len(rest) < 2 {
		return 0, errors.New("needs a dead letter ID")
	}
	id, err := strconv.ParseInt(rest[1], 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%q is not a dead letter ID", rest[1])
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

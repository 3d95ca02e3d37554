package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/history"
)

// jobControlCommands are jobs enqueue and jobs list.
func (cl *cli) jobControlCommands() []*command {
	return []*command{
		{name: "enqueue", args: "KIND JSON", summary: "enqueue a job of KIND with payload JSON, as an application does (--dedup-key: once per key; --priority 1-5)",
			flags: cl.jobsEnqueue},
		{name: "list", summary: "jobs, newest first, by --kind and --state; says when --limit cut the list", flags: cl.jobsList},
		{name: "cancel", args: "ID", summary: "cancel a job no host has started (pending, scheduled, or on the stream): it never runs; a run already started finishes",
			help: cancelHelp, flags: cl.jobsCancel},
		{name: "run-now", args: "ID", summary: "make a scheduled job (waiting to retry, or scheduled for later) due now", flags: cl.jobsRunNow},
	}
}

// enqueued is what `host jobs enqueue --json` prints.
type enqueued struct {
	ID int64 `json:"id"`
	// Duplicate: the dedup key was held, and ID is the job that holds it.
	Duplicate bool `json:"duplicate"`
}

func (cl *cli) jobsEnqueue(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	key := fs.String("dedup-key", "", "enqueue nothing while a job of KIND with this key is in its window, and print that job's id")
	window := fs.Duration("dedup-window", 0, "with --dedup-key: how long the key holds (default 24h)")
	requestID := fs.String("request-id", "", "the request id the job's log lines carry")
	priority := fs.Int("priority", client.DefaultPriority, "the job's priority: 1 (the highest) to 5 (the lowest); a job of a higher priority starts before any waiting of a lower")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 2 || pos[0] == "" {
			return usageError{fmt.Sprintf("jobs enqueue takes a kind and a JSON payload, got %q", pos)}
		}
		if !json.Valid([]byte(pos[1])) {
			return usageError{fmt.Sprintf("jobs enqueue: the payload %q is not JSON (quote it for the shell: '{\"order_id\": 1}')", pos[1])}
		}
		if *window != 0 && *key == "" {
			return usageError{"--dedup-window needs --dedup-key"}
		}
		if *priority < client.HighestPriority || *priority > client.LowestPriority {
			return usageError{fmt.Sprintf("--priority %d: a priority is %d (the highest) to %d (the lowest)", *priority, client.HighestPriority, client.LowestPriority)}
		}
		job := client.Job{Kind: pos[0], Payload: json.RawMessage(pos[1]), RequestID: *requestID, DedupKey: *key, DedupWindow: *window,
			Priority: *priority}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			var out enqueued
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				id, err := client.Enqueue(ctx, tx, job)
				if err != nil {
					return err
				}
				out.ID = id
				// A row this transaction wrote is a new job; else the key
				// named another's.
				var mine bool
				err = tx.QueryRow(ctx, `SELECT coalesce((SELECT xmin = pg_current_xact_id()::xid FROM outbox WHERE id = $1), false)`, id).Scan(&mine)
				out.Duplicate = !mine
				return err
			})
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, out)
			}
			if out.Duplicate {
				_, err = fmt.Fprintf(cl.stdout, "job %d holds dedup key %q of %s: nothing enqueued\n", out.ID, *key, job.Kind)
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "enqueued %s job %d\n", job.Kind, out.ID)
			return err
		})
	}
}

// listedShown is what `host jobs list --json` prints.
type listedShown struct {
	Jobs []history.Listed `json:"jobs"`
	// Total is how many jobs the filters select; Cut that the list shows
	// fewer (--limit).
	Total int  `json:"total"`
	Cut   bool `json:"cut"`
}

func (cl *cli) jobsList(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	kind := fs.String("kind", "", "only jobs of this kind")
	state := fs.String("state", "", "only jobs in this state: "+strings.Join(history.States, ", "))
	limit := fs.Int("limit", 50, "at most this many, newest first")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("jobs list takes no arguments, got %q", pos)}
		}
		if *limit <= 0 {
			return usageError{fmt.Sprintf("--limit must be positive, got %d", *limit)}
		}
		if *state != "" && !slices.Contains(history.States, *state) {
			return usageError{fmt.Sprintf("--state %q: one of %s", *state, strings.Join(history.States, ", "))}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			jobs, total, err := history.List(ctx, pool, history.Filter{Kind: *kind, State: *state, Limit: *limit})
			if err != nil {
				return err
			}
			out := listedShown{Jobs: jobs, Total: total, Cut: total > len(jobs)}
			if out.Jobs == nil {
				out.Jobs = []history.Listed{}
			}
			if *asJSON {
				return writeJSON(cl.stdout, out)
			}
			if len(jobs) == 0 {
				_, err := fmt.Fprintln(cl.stdout, "no job matches")
				return err
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "JOB\tKIND\tSTATE\tATTEMPTS\tCREATED\tREQUEST ID")
			for _, j := range jobs {
				st := j.State
				if j.RetryAt != nil {
					st += " (due " + j.RetryAt.UTC().Format(time.RFC3339) + ")"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", j.ID, j.Kind, st, j.Attempts, j.CreatedAt.UTC().Format(time.RFC3339), j.RequestID)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if out.Cut {
				_, err = fmt.Fprintf(cl.stdout, "showing the newest %d of %d matching jobs: --limit %d shows them all\n", len(jobs), total, total)
			} else {
				_, err = fmt.Fprintf(cl.stdout, "%d job(s)\n", total)
			}
			return err
		})
	}
}

package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/jobctl"
)

const cancelHelp = `A job is cancelled where it waits before any host has started it. A
scheduled run, or an outbox row the relay has not published: the cancel
takes the row's lock as the scheduler and the relay do, so a job
cancelled there never runs. A job on the stream: the cancel is a request
every host hears at once (LISTEN/NOTIFY, and a poll every second) and no
host starts it from then on; it is settled cancelled when next
delivered. A host that started it before it heard lets the run finish
under its guard, and the job ends applied: ` + "`host jobs show ID`" + ` tells
which (its state, and each delivery's verdict). Refused for a job that
ended, is dead-lettered (discard its letter) or is a workflow's (cancel
the workflow). Recorded in operator_actions with --by and the database
login; ` + "`host jobs show ID`" + ` lists it.`

// oneJob checks a job command's one ID.
func oneJob(cmd string, pos []string) (string, error) {
	if len(pos) != 1 || strings.TrimSpace(pos[0]) == "" {
		return "", usageError{fmt.Sprintf("jobs %s takes one job ID, got %q", cmd, pos)}
	}
	return pos[0], nil
}

func (cl *cli) jobsCancel(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	reason := fs.String("reason", "", "why, recorded with the cancel")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		id, err := oneJob("cancel", pos)
		if err != nil {
			return err
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			c, err := jobctl.Cancel(ctx, pool, id, *by, *reason)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, c)
			}
			_, err = fmt.Fprintln(cl.stdout, c.String())
			return err
		})
	}
}

func (cl *cli) jobsRunNow(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	return func(ctx context.Context, pos []string) error {
		id, err := oneJob("run-now", pos)
		if err != nil {
			return err
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			was, err := jobctl.RunNow(ctx, pool, id, *by)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "job %s is due now (was due %s): the scheduler moves it to the outbox within a second\n",
				id, was.UTC().Format(time.RFC3339))
			return err
		})
	}
}

func (cl *cli) deadLettersDiscard(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	reason := fs.String("reason", "", "why, kept with the letter")
	return func(ctx context.Context, pos []string) error {
		id, err := idArg("discard", pos)
		if err != nil {
			return err
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			job, err := jobctl.Discard(ctx, pool, id, *by, *reason)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "discarded dead letter %d of job %s: kept in its history, no longer open\n", id, job)
			return err
		})
	}
}

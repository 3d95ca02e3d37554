package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/pause"
)

const pauseHelp = `A paused kind's deliveries wait in the stream on every host: nothing is
lost or dead-lettered, and waiting does not count towards a job's
deliveries. Each host reads the paused kinds every second (host.Config's
PausePollInterval); a run already started finishes. After resume the
waiting entries run within seconds, at most within the reclaim
threshold. Each pause and resume is recorded in operator_actions, with
--by (default $USER@hostname) and the database login.`

func (cl *cli) kindCommands() []*command {
	return append([]*command{
		{name: "paused", summary: "the paused kinds, and the last pauses and resumes", flags: cl.kindsPaused},
		{name: "pause", args: "KIND", summary: "pause KIND on every host: its deliveries wait in the stream", help: pauseHelp, flags: cl.kindsPause},
		{name: "resume", args: "KIND", summary: "resume a paused KIND: its waiting deliveries run", help: pauseHelp, flags: cl.kindsResume},
	}, cl.limitCommands()...)
}

// actingOperator is who the CLI says acts: $USER@hostname.
func actingOperator() string {
	who := env("USER", "unknown")
	if h, err := os.Hostname(); err == nil {
		who += "@" + h
	}
	return who
}

func (cl *cli) kindsPause(fs *flag.FlagSet) runner  { return cl.kindsAction(fs, false) }
func (cl *cli) kindsResume(fs *flag.FlagSet) runner { return cl.kindsAction(fs, true) }

// kindsAction is kinds pause, or kinds resume.
func (cl *cli) kindsAction(fs *flag.FlagSet, resume bool) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	verb, reason := "resume", new(string)
	if !resume {
		verb, reason = "pause", fs.String("reason", "", "why, recorded with the pause")
	}
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("kinds %s takes one kind, got %q", verb, pos)}
		}
		kind := pos[0]
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			if resume {
				changed, err := pause.Resume(ctx, pool, kind, *by)
				if err != nil {
					return err
				}
				if !changed {
					_, err = fmt.Fprintf(cl.stdout, "%s was not paused\n", kind)
					return err
				}
				_, err = fmt.Fprintf(cl.stdout, "resumed %s: its waiting deliveries run on every host within seconds\n", kind)
				return err
			}
			p, changed, err := pause.Pause(ctx, pool, kind, *by, *reason)
			if err != nil {
				return err
			}
			if !changed {
				_, err = fmt.Fprintf(cl.stdout, "%s is paused already, since %s by %s\n", kind, p.PausedAt.UTC().Format(time.RFC3339), p.PausedBy)
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "paused %s: every host leaves its deliveries waiting in the stream within a second\n", kind)
			return err
		})
	}
}

// pausedShown is what `host kinds paused --json` prints.
type pausedShown struct {
	Paused  []pause.Paused `json:"paused"`
	Actions []pause.Action `json:"actions"`
	// ActionsTotal counts every operator action; Actions holds the last
	// --limit of them.
	ActionsTotal int `json:"actions_total"`
}

func (cl *cli) kindsPaused(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	limit := fs.Int("limit", 20, "at most this many of the last operator actions")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("kinds paused takes no arguments, got %q", pos)}
		}
		if *limit <= 0 {
			return usageError{fmt.Sprintf("--limit must be positive, got %d", *limit)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			var out pausedShown
			var err error
			if out.Paused, err = pause.List(ctx, pool); err != nil {
				return err
			}
			if out.Actions, out.ActionsTotal, err = pause.Actions(ctx, pool, "", *limit); err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, out)
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			if len(out.Paused) == 0 {
				fmt.Fprintln(w, "no kind is paused")
			} else {
				fmt.Fprintln(w, "KIND\tSINCE\tBY\tREASON")
				for _, p := range out.Paused {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", p.Kind, p.PausedAt.UTC().Format(time.RFC3339), p.PausedBy, p.Reason)
				}
			}
			if len(out.Actions) > 0 {
				if len(out.Actions) < out.ActionsTotal {
					fmt.Fprintf(w, "\nthe last %d of %d operator actions: --limit %d shows them all\n", len(out.Actions), out.ActionsTotal, out.ActionsTotal)
				} else {
					fmt.Fprintf(w, "\n%d operator action(s)\n", len(out.Actions))
				}
				fmt.Fprintln(w, "AT\tACTION\tTARGET\tBY\tDB USER\tDETAIL")
				for _, a := range out.Actions {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", a.At.UTC().Format(time.RFC3339), a.Action, a.Target, a.Actor, a.DBUser, a.Detail)
				}
			}
			return w.Flush()
		})
	}
}

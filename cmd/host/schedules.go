package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/recurring"
)

const schedulesHelp = `A schedule starts a workflow (id NAME@TICK, an RFC 3339 time in UTC) or
enqueues a job (deduplication key NAME@TICK) once per tick, whichever host
takes it. --cron takes a standard 5-field spec or a descriptor (@hourly,
@daily, @every 90m), in UTC unless it starts with CRON_TZ=Area/City.
--catch-up says what a schedule due more than once (its hosts were down)
fires: all (every missed tick), one (the latest; the default) or skip
(none but a tick less than a minute late). A paused schedule skips its
ticks; resumed, its next tick is the first after now.`

func (cl *cli) scheduleCommands() []*command {
	return []*command{
		{name: "list", summary: "the schedules, their next tick and what they fired", flags: cl.schedulesList},
		{name: "add", args: "NAME", summary: "add a schedule: --workflow TYPE or --job KIND, --cron SPEC or --every DURATION", help: schedulesHelp,
			flags: cl.schedulesAdd},
		{name: "pause", args: "NAME", summary: "pause a schedule: its ticks are skipped", flags: cl.schedulesPause},
		{name: "resume", args: "NAME", summary: "resume a schedule at its first tick after now", flags: cl.schedulesResume},
		{name: "delete", args: "NAME", summary: "delete a schedule (what its ticks started runs on)", flags: cl.schedulesDelete},
	}
}

func (cl *cli) schedulesAdd(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	wf := fs.String("workflow", "", "start a workflow of this type at each tick")
	job := fs.String("job", "", "enqueue a job of this kind at each tick")
	input := fs.String("input", "null", "the workflow's input or the job's payload (JSON)")
	spec := fs.String("cron", "", "a cron spec (5 fields, or @hourly, @every 90m, ...)")
	every := fs.Duration("every", 0, "an interval (at least 1s)")
	catchUp := fs.String("catch-up", recurring.CatchUpOne, "all, one or skip: what a schedule due more than once fires")
	paused := fs.Bool("paused", false, "add it paused")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("schedules add takes one name, got %q", pos)}
		}
		s := recurring.Schedule{Name: pos[0], Input: json.RawMessage(*input), Cron: *spec, Every: *every, CatchUp: *catchUp, Paused: *paused}
		switch {
		case (*wf == "") == (*job == ""):
			return usageError{"schedules add takes --workflow TYPE or --job KIND, one of them"}
		case *wf != "":
			s.Target, s.What = recurring.Workflow, *wf
		default:
			s.Target, s.What = recurring.Job, *job
		}
		if !json.Valid(s.Input) {
			return usageError{fmt.Sprintf("--input %q is not valid JSON", *input)}
		}
		if err := s.Check(); err != nil {
			return usageError{err.Error()}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			s, err := recurring.Add(ctx, pool, s, time.Now())
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, s)
			}
			_, err = fmt.Fprintf(cl.stdout, "schedule %s added: %s, next tick %s\n", s.Name, scheduleText(s), s.NextAt.UTC().Format(time.RFC3339))
			return err
		})
	}
}

// scheduleText says what a schedule does and when.
func scheduleText(s recurring.Schedule) string {
	when := "cron " + s.Cron
	if s.Every > 0 {
		when = "every " + s.Every.String()
	}
	verb := "starts workflow"
	if s.Target == recurring.Job {
		verb = "enqueues job"
	}
	return fmt.Sprintf("%s %s %s (catch-up %s)", verb, s.What, when, s.CatchUp)
}

func (cl *cli) schedulesList(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("schedules list takes no arguments, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			list, err := recurring.List(ctx, pool)
			if err != nil {
				return err
			}
			if *asJSON {
				if list == nil {
					list = []recurring.Schedule{}
				}
				return writeJSON(cl.stdout, list)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(cl.stdout, "no schedule")
				return err
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tDOES\tNEXT\tFIRED\tSKIPPED\tSTATE")
			for _, s := range list {
				state := "active"
				if s.Paused {
					state = "paused"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", s.Name, scheduleText(s), s.NextAt.UTC().Format(time.RFC3339), s.Fired, s.Skipped, state)
			}
			return w.Flush()
		})
	}
}

func (cl *cli) schedulesPause(fs *flag.FlagSet) runner  { return cl.schedulesSetPaused(fs, true) }
func (cl *cli) schedulesResume(fs *flag.FlagSet) runner { return cl.schedulesSetPaused(fs, false) }

func (cl *cli) schedulesSetPaused(fs *flag.FlagSet, paused bool) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	verb := map[bool]string{true: "pause", false: "resume"}[paused]
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("schedules %s takes one name, got %q", verb, pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			s, err := recurring.SetPaused(ctx, pool, pos[0], paused, time.Now())
			if err != nil {
				return err
			}
			if paused {
				_, err = fmt.Fprintf(cl.stdout, "schedule %s paused: its ticks are skipped\n", s.Name)
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "schedule %s resumed: next tick %s\n", s.Name, s.NextAt.UTC().Format(time.RFC3339))
			return err
		})
	}
}

func (cl *cli) schedulesDelete(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("schedules delete takes one name, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			if err := recurring.Delete(ctx, pool, pos[0]); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cl.stdout, "schedule %s deleted\n", pos[0])
			return err
		})
	}
}

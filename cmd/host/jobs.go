package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/ops"
)

func (cl *cli) jobCommands() []*command {
	return append([]*command{
		{name: "show", args: "ID", summary: "one job: its state and every delivery's record (attempt, consumer, plugin, guard, verdict, duration, error)",
			flags: cl.jobsShow},
	}, cl.jobControlCommands()...)
}

func (cl *cli) workflowCommands() []*command {
	return append([]*command{
		{name: "show", args: "REQUEST_ID", summary: "the jobs one request started, as a tree, each with its state and history",
			flags: cl.workflowsShow},
	}, cl.durableWorkflowCommands()...)
}

func (cl *cli) jobsShow(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 || pos[0] == "" {
			return usageError{fmt.Sprintf("jobs show takes one job ID, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			j, err := history.GetJob(ctx, pool, pos[0])
			if errors.Is(err, history.ErrNotFound) {
				return fmt.Errorf("no job %s: no outbox row, dead letter or history names it (history is kept for --history-retention)", pos[0])
			}
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, j)
			}
			return printJob(cl.stdout, j)
		})
	}
}

func (cl *cli) workflowsShow(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 || pos[0] == "" {
			return usageError{fmt.Sprintf("workflows show takes one request ID, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			// A durable workflow's request id is TYPE:ID: its history first.
			if found, err := cl.showDurable(ctx, pool, pos[0], *asJSON); found || err != nil {
				return err
			}
			w, err := history.GetWorkflow(ctx, pool, pos[0])
			if errors.Is(err, history.ErrNotFound) {
				return fmt.Errorf("no workflow %s: no outbox row or history carries that request id", pos[0])
			}
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, w)
			}
			return printWorkflow(cl.stdout, w)
		})
	}
}

func printJob(out io.Writer, j *history.Job) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	parent := j.Parent
	if parent == "" {
		parent = "-"
	}
	fmt.Fprintf(w, "job\t%s\n", j.ID)
	fmt.Fprintf(w, "kind\t%s\n", j.Kind)
	fmt.Fprintf(w, "state\t%s\n", stateText(j))
	fmt.Fprintf(w, "request id\t%s\n", j.RequestID)
	fmt.Fprintf(w, "parent job\t%s\n", parent)
	fmt.Fprintf(w, "attempts\t%d\n", j.Attempts)
	if j.Priority != 0 && j.Priority != client.DefaultPriority {
		fmt.Fprintf(w, "priority\t%d (1 the highest, 5 the lowest; %d by default)\n", j.Priority, client.DefaultPriority)
	}
	fmt.Fprintf(w, "absorbed\t%d\n", j.Absorbed)
	if p := j.Payload; p != nil {
		if p.Gone != "" {
			fmt.Fprintf(w, "payload\t%s\n", p.Gone)
		} else {
			fmt.Fprintf(w, "payload\t%d bytes, from %s (--json prints it)\n", p.Bytes, p.From)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := printHistory(out, "", j.History, time.Time{}); err != nil {
		return err
	}
	return printActions(out, j)
}

// printActions prints what operators did to j, when they did anything.
func printActions(out io.Writer, j *history.Job) error {
	if len(j.Actions) == 0 {
		return nil
	}
	fmt.Fprintln(out, "operator actions")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "AT\tACTION\tBY\tDB USER\tDETAIL")
	for _, a := range j.Actions {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", a.At.UTC().Format(time.RFC3339), a.Action, a.Actor, a.DBUser, dash(truncate(a.Detail, 120)))
	}
	return w.Flush()
}

// stateText is a job's state with what explains it.
func stateText(j *history.Job) string {
	switch {
	case j.State == history.WaitingToRetry && j.RetryAt != nil:
		return fmt.Sprintf("%s (due %s)", j.State, j.RetryAt.UTC().Format(time.RFC3339))
	case j.State == history.DeadLetteredState:
		return fmt.Sprintf("%s (dead letter %d: %s)", j.State, j.DeadLetter, truncate(j.DeadLetterReason, 100))
	case j.State == history.Discarded:
		return fmt.Sprintf("%s (dead letter %d, kept: %s)", j.State, j.DeadLetter, truncate(j.DeadLetterReason, 100))
	case j.HeldBy != nil:
		return fmt.Sprintf("%s, held: kind %s paused by %s since %s%s; no host starts it until `host kinds resume %s`",
			j.State, j.HeldBy.Kind, j.HeldBy.PausedBy, j.HeldBy.PausedAt.UTC().Format(time.RFC3339), reasonText(j.HeldBy.Reason), j.HeldBy.Kind)
	}
	return j.State
}

// reasonText is a pause's reason after its other facts, "" for none.
func reasonText(reason string) string {
	if reason == "" {
		return ""
	}
	return " (" + truncate(reason, 100) + ")"
}

// printHistory prints records as a table, each line after indent. With
// an origin (a request's first delivery), each record starts with its
// start's offset from it: the rows of a request's jobs read on one time
// axis, as the console's timeline draws them.
func printHistory(out io.Writer, indent string, recs []history.Record, origin time.Time) error {
	if len(recs) == 0 {
		_, err := fmt.Fprintf(out, "%sno deliveries recorded\n", indent)
		return err
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	if !origin.IsZero() {
		fmt.Fprint(w, "+START\t")
	}
	fmt.Fprintln(w, "FINISHED\tATTEMPT\tDELIVERY\tCONSUMER\tPLUGIN\tGUARD\tVERDICT\tTOOK\tREASON / ERROR")
	for _, r := range recs {
		if !origin.IsZero() {
			fmt.Fprintf(w, "+%s\t", ops.HumanDuration(r.StartedAt.Sub(origin)))
		}
		plugin := r.Plugin
		if r.PluginVersion != "" {
			plugin += " " + r.PluginVersion
		}
		why := r.Reason
		if r.Error != "" && r.Error != r.Reason && !strings.Contains(r.Reason, r.Error) {
			why = strings.TrimPrefix(why+"; error: "+r.Error, "; ")
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.FinishedAt.UTC().Format(time.RFC3339), ops.Attempt(r.Attempt), r.Deliveries,
			dash(r.Consumer), dash(plugin), dash(r.Guard), r.Verdict, r.Duration().Round(time.Millisecond), dash(truncate(why, 120)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if _, err := fmt.Fprint(out, indent, line); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(out)
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printWorkflow(out io.Writer, wf *history.Workflow) error {
	states := make([]string, 0, len(wf.States))
	for s, n := range wf.States {
		states = append(states, fmt.Sprintf("%s %d", s, n))
	}
	sort.Strings(states)
	// The request's first delivery is the origin of every job's rows.
	origin := wf.FirstStart()
	since := ""
	if !origin.IsZero() {
		since = ", from its first delivery at " + origin.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	if _, err := fmt.Fprintf(out, "workflow %s: %d jobs (%s)%s\n", wf.RequestID, wf.Count, strings.Join(states, ", "), since); err != nil {
		return err
	}
	var walk func(jobs []*history.Job, prefix string) error
	walk = func(jobs []*history.Job, prefix string) error {
		for i, j := range jobs {
			branch, cont := "├─ ", "│  "
			if i == len(jobs)-1 {
				branch, cont = "└─ ", "   "
			}
			absorbed := ""
			if j.Absorbed > 0 {
				absorbed = fmt.Sprintf(", %d duplicate(s) absorbed", j.Absorbed)
			}
			if _, err := fmt.Fprintf(out, "%s%sjob %s %s: %s (%d attempt(s)%s)\n", prefix, branch, j.ID, j.Kind, stateText(j), j.Attempts, absorbed); err != nil {
				return err
			}
			under := prefix + cont
			if len(j.Children) > 0 {
				under += "│ "
			} else {
				under += "  "
			}
			if err := printHistory(out, under, j.History, origin); err != nil {
				return err
			}
			if err := walk(j.Children, prefix+cont); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(wf.Jobs, "")
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/workflow"
)

// The durable workflows' commands (issue 27): start, signal and cancel
// call the same SQL functions an application calls in its transaction.
func (cl *cli) durableWorkflowCommands() []*command {
	return []*command{
		{name: "start", args: "TYPE ID [JSON]", summary: "start workflow ID of TYPE with input JSON (default null); an ID that exists is returned as it is",
			flags: cl.workflowsStart},
		{name: "signal", args: "TYPE ID SIGNAL_ID NAME [JSON]", summary: "send signal NAME with payload JSON to a running workflow; a SIGNAL_ID counts once",
			flags: cl.workflowsSignal},
		{name: "cancel", args: "TYPE ID [REASON]", summary: "ask a running workflow to cancel: its next decision sees the request",
			flags: cl.workflowsCancel},
		{name: "list", summary: "workflows, newest first, by type, state and age", flags: cl.workflowsList},
		{name: "migrate", args: "TYPE [ID...]", summary: "ask a running host to move running workflows of TYPE to the version now serving it, each one if that version accepts it",
			flags: cl.workflowsMigrate},
	}
}

func (cl *cli) workflowsMigrate(fs *flag.FlagSet) runner {
	var c adminClient
	c.register(fs)
	from := fs.String("from", "", "only the workflows pinned to this version (default: any version but the one serving the type)")
	limit := fs.Int("limit", 100, fmt.Sprintf("at most this many workflows, oldest first (1 to %d)", workflow.MaxMigrate))
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the host's answer")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 1 {
			return usageError{"workflows migrate takes TYPE [ID...]"}
		}
		if *limit < 1 || *limit > workflow.MaxMigrate {
			return usageError{fmt.Sprintf("--limit must be 1 to %d, got %d", workflow.MaxMigrate, *limit)}
		}
		if *timeout <= 0 {
			return usageError{fmt.Sprintf("--timeout must be positive, got %s", *timeout)}
		}
		if err := c.load(); err != nil {
			return err
		}
		body, err := json.Marshal(workflow.MigrateRequest{Type: pos[0], From: *from, IDs: pos[1:], Limit: *limit})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		resp, err := c.send(ctx, http.MethodPost, "/workflows/migrate", bytes.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out struct {
			workflow.MigrateResult
			Error string `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return fmt.Errorf("host answered %s: %w", resp.Status, err)
		}
		if out.Error != "" {
			return errors.New(out.Error)
		}
		res := out.MigrateResult
		if *asJSON {
			if err := writeJSON(cl.stdout, res); err != nil {
				return err
			}
		} else {
			for _, m := range res.Migrated {
				fmt.Fprintf(cl.stdout, "%s workflow %s: migrated %s -> %s\n", res.Type, m.ID, m.From, res.To)
			}
			for _, r := range res.Refused {
				fmt.Fprintf(cl.stdout, "%s workflow %s: stays on %s: %s\n", res.Type, r.ID, r.From, r.Reason)
			}
			fmt.Fprintf(cl.stdout, "%d of %d migrated to %s %s, %d refused", len(res.Migrated), res.Selected, res.Plugin, res.To, len(res.Refused))
			if res.More {
				fmt.Fprintf(cl.stdout, " (cut at --limit %d: more remain)", *limit)
			}
			fmt.Fprintln(cl.stdout)
		}
		if len(res.Refused) > 0 {
			return fmt.Errorf("%d workflow(s) refused", len(res.Refused))
		}
		return nil
	}
}

func jsonArg(pos []string, i int) (json.RawMessage, error) {
	if len(pos) <= i {
		return json.RawMessage("null"), nil
	}
	if !json.Valid([]byte(pos[i])) {
		return nil, usageError{fmt.Sprintf("%q is not valid JSON", pos[i])}
	}
	return json.RawMessage(pos[i]), nil
}

func (cl *cli) workflowsStart(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 2 || len(pos) > 3 {
			return usageError{fmt.Sprintf("workflows start takes TYPE ID [JSON], got %q", pos)}
		}
		input, err := jsonArg(pos, 2)
		if err != nil {
			return err
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			w, err := client.StartWorkflow(ctx, pool, pos[0], pos[1], input)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, w)
			}
			verb := "started"
			if !w.Started {
				verb = "exists"
			}
			_, err = fmt.Fprintf(cl.stdout, "%s workflow %s %s (%d): %s\n", pos[0], pos[1], verb, w.ID, w.State)
			return err
		})
	}
}

func (cl *cli) workflowsSignal(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 4 || len(pos) > 5 {
			return usageError{fmt.Sprintf("workflows signal takes TYPE ID SIGNAL_ID NAME [JSON], got %q", pos)}
		}
		payload, err := jsonArg(pos, 4)
		if err != nil {
			return err
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			added, err := client.SignalWorkflow(ctx, pool, pos[0], pos[1], pos[2], pos[3], payload)
			if err != nil {
				return err
			}
			what := "received"
			if !added {
				what = "received before; counted once"
			}
			_, err = fmt.Fprintf(cl.stdout, "signal %s (%s) to %s workflow %s: %s\n", pos[3], pos[2], pos[0], pos[1], what)
			return err
		})
	}
}

func (cl *cli) workflowsCancel(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 2 || len(pos) > 3 {
			return usageError{fmt.Sprintf("workflows cancel takes TYPE ID [REASON], got %q", pos)}
		}
		reason := ""
		if len(pos) == 3 {
			reason = pos[2]
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			asked, err := client.CancelWorkflow(ctx, pool, pos[0], pos[1], reason)
			if err != nil {
				return err
			}
			what := "cancel requested"
			if !asked {
				what = "cancel requested before"
			}
			_, err = fmt.Fprintf(cl.stdout, "%s workflow %s: %s\n", pos[0], pos[1], what)
			return err
		})
	}
}

func (cl *cli) workflowsList(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	var f workflow.Filter
	fs.StringVar(&f.Type, "type", "", "only workflows of this type")
	fs.StringVar(&f.State, "state", "", "only workflows in this state: "+strings.Join(workflow.States, ", "))
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only workflows started at least this long ago")
	fs.IntVar(&f.Limit, "limit", 100, "at most this many, newest first; a cut list says so")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 0 {
			return usageError{fmt.Sprintf("workflows list takes no arguments, got %q", pos)}
		}
		if f.State != "" && !slices.Contains(workflow.States, f.State) {
			return usageError{fmt.Sprintf("--state %q: a workflow's state is one of %s", f.State, strings.Join(workflow.States, ", "))}
		}
		if f.Limit <= 0 {
			return usageError{fmt.Sprintf("--limit must be positive, got %d", f.Limit)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			ws, err := workflow.List(ctx, pool, f)
			if err != nil {
				return err
			}
			// Cut: say so, and how to see the rest (on stderr under
			// --json, whose stdout stays the list).
			cut := func(out io.Writer) error {
				if len(ws) < f.Limit {
					return nil
				}
				total, _, err := workflow.Count(ctx, pool, f)
				if err != nil || total <= int64(len(ws)) {
					return err
				}
				_, err = fmt.Fprintf(out, "the newest %d of %d workflows: --limit %d shows them all\n", len(ws), total, total)
				return err
			}
			if *asJSON {
				if ws == nil {
					ws = []workflow.Summary{}
				}
				if err := writeJSON(cl.stdout, ws); err != nil {
					return err
				}
				return cut(cl.stderr)
			}
			if len(ws) == 0 {
				_, err := fmt.Fprintln(cl.stdout, "no workflows")
				return err
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TYPE\tID\tSTATE\tEVENTS\tPLUGIN\tSTARTED\tREQUEST ID")
			for _, s := range ws {
				plugin := strings.TrimSpace(s.Plugin + " " + s.PluginVersion)
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Type, s.WorkflowID, s.State, s.Events, dash(plugin),
					s.CreatedAt.UTC().Format(time.RFC3339), s.RequestID)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			return cut(cl.stdout)
		})
	}
}

// durableShown is `workflows show --json` of a durable workflow's request
// id: the workflow with its history, and the tree of its jobs.
type durableShown struct {
	Workflow *workflow.Workflow `json:"workflow"`
	Jobs     *history.Workflow  `json:"jobs,omitempty"`
}

// showDurable prints the durable workflow whose request id is requestID,
// if there is one, then the tree of its jobs; false when there is none.
func (cl *cli) showDurable(ctx context.Context, pool *pgxpool.Pool, requestID string, asJSON bool) (bool, error) {
	w, err := workflow.GetByRequestID(ctx, pool, requestID)
	if errors.Is(err, workflow.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	jobs, err := history.GetWorkflow(ctx, pool, requestID)
	if err != nil && !errors.Is(err, history.ErrNotFound) {
		return true, err
	}
	if asJSON {
		return true, writeJSON(cl.stdout, durableShown{Workflow: w, Jobs: jobs})
	}
	if err := printDurable(cl.stdout, w); err != nil {
		return true, err
	}
	if jobs == nil {
		return true, nil
	}
	if _, err := fmt.Fprintln(cl.stdout); err != nil {
		return true, err
	}
	return true, printWorkflow(cl.stdout, jobs)
}

func printDurable(out io.Writer, wf *workflow.Workflow) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "workflow\t%s %s (%d)\n", wf.Type, wf.WorkflowID, wf.ID)
	fmt.Fprintf(w, "state\t%s\n", wf.State)
	fmt.Fprintf(w, "plugin\t%s\n", dash(strings.TrimSpace(wf.Plugin+" "+wf.PluginVersion)))
	fmt.Fprintf(w, "input\t%s\n", truncate(string(wf.Input), 200))
	if len(wf.Result) > 0 {
		fmt.Fprintf(w, "result\t%s\n", truncate(string(wf.Result), 200))
	}
	if wf.Error != "" {
		fmt.Fprintf(w, "error\t%s\n", truncate(wf.Error, 200))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SEQ\tAT\tEVENT\tNAME\tDETAIL\tDATA")
	for _, e := range wf.Events {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.At.UTC().Format("2006-01-02T15:04:05.000Z"), e.Type, dash(e.Name),
			dash(truncate(e.Detail, 80)), dash(truncate(string(e.Data), 80)))
	}
	return w.Flush()
}

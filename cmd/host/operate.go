package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/sandbox"
)

func (cl *cli) inspectFlags(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.register(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("inspect takes no arguments, got %q", pos)}
		}
		redisURL, err := conn.redis()
		if err != nil {
			return err
		}
		rdb, err := host.NewRedisClient(redisURL, conn.redisCAFile)
		if err != nil {
			return err
		}
		defer rdb.Close()
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			in, err := ops.Inspect(ctx, pool, rdb, conn.stream, conn.group, cl.now())
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(cl.stdout, in)
			}
			return printInspection(cl.stdout, in)
		})
	}
}

// jsonFlag registers --json, the read commands' machine-readable output.
func jsonFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("json", false, "print JSON instead of text")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printInspection prints in as `host inspect` shows it.
func printInspection(out io.Writer, in ops.Inspection) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "stream\t%s (group %s)\n", in.Stream, in.Group)
	fmt.Fprintf(w, "  entries\t%d\n", in.Entries)
	switch {
	case strings.HasPrefix(in.PendingError, "NOGROUP"):
		fmt.Fprintf(w, "  pending\tno group %s on this stream: is --stream right?\n", in.Group)
	case in.PendingError != "":
		fmt.Fprintf(w, "  pending\t%s\n", in.PendingError)
	default:
		fmt.Fprintf(w, "  pending\t%d\n", in.Pending)
	}
	for _, c := range in.Consumers {
		fmt.Fprintf(w, "    %s\t%d\n", c.Consumer, c.Pending)
	}
	if in.PendingError == "" {
		if in.Lag.GroupLag >= 0 {
			fmt.Fprintf(w, "  group lag\t%d undelivered\n", in.Lag.GroupLag)
		} else {
			fmt.Fprintf(w, "  group lag\tunknown (Redis cannot count it after a trim or deletion)\n")
		}
		fmt.Fprintf(w, "  oldest pending\t%s\n", ageText(in.Lag.OldestPending))
	}
	if len(in.Shards) > 1 {
		// Shown only when there are several (host run --stream-shards).
		fmt.Fprintf(w, "  shards\t%d\n", len(in.Shards))
		for _, sh := range in.Shards {
			lag := "unknown"
			if sh.GroupLag >= 0 {
				lag = strconv.FormatInt(sh.GroupLag, 10)
			}
			fmt.Fprintf(w, "    %s\t%d entries, %d pending, lag %s\n", sh.Stream, sh.Entries, sh.Pending, lag)
		}
	}
	if in.PrioritiesUsed() {
		// Shown only once a job named a priority other than the default.
		fmt.Fprintf(w, "  by priority\n")
		for _, b := range in.Priorities {
			fmt.Fprintf(w, "    %d\t%d entries, %d pending\n", b.Priority, b.Entries, b.Pending)
		}
	}
	fmt.Fprintf(w, "outbox unpublished\t%d\n", in.OutboxUnpublished)
	fmt.Fprintf(w, "  relay lag\t%s\n", ageText(in.Lag.RelayLag))
	fmt.Fprintf(w, "scheduled runs\t%d due, %d later\n", in.ScheduledDue, in.ScheduledLater)
	fmt.Fprintf(w, "processed job ids\t%d\n", in.ProcessedJobs)
	if err := w.Flush(); err != nil {
		return err
	}
	if len(in.WaitingForKind) > 0 {
		// Shown only when there are any: a new kind's rolling deploy.
		fmt.Fprintln(out, "\nwaiting for a host serving their kind")
		fmt.Fprintln(w, "  KIND\tJOBS")
		for _, k := range in.WaitingForKind {
			fmt.Fprintf(w, "  %s\t%d\n", k.Kind, k.Count)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if len(in.Paused) > 0 {
		// Shown only when there are any (host kinds pause).
		fmt.Fprintln(out, "\npaused kinds (their deliveries wait in the stream)")
		fmt.Fprintln(w, "  KIND\tSINCE\tBY\tREASON")
		for _, p := range in.Paused {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", p.Kind, p.PausedAt.UTC().Format(time.RFC3339), p.PausedBy, p.Reason)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if err := printLimited(out, in.Limited); err != nil {
		return err
	}
	fmt.Fprintln(out, "\ndead letters (open)")
	if len(in.DeadLetters) == 0 {
		fmt.Fprintln(out, "  none")
	} else {
		fmt.Fprintln(w, "  KIND\tCOUNT")
		for _, k := range in.DeadLetters {
			fmt.Fprintf(w, "  %s\t%d\n", k.Kind, k.Count)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "\nduplicates absorbed")
	if len(in.Absorbed) == 0 {
		_, err := fmt.Fprintln(out, "  none")
		return err
	}
	fmt.Fprintln(w, "  GUARD\tKIND\tREASON\tCOUNT")
	for _, a := range in.Absorbed {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%d\n", a.Guard, a.Kind, a.Reason, a.Count)
	}
	return w.Flush()
}

// ageText prints an age from Lag: "none" for 0, else to the second (to
// the millisecond under a second).
func ageText(d time.Duration) string {
	switch {
	case d <= 0:
		return "none"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// noSchema explains a query on a database without usher's tables: the
// default --database-url names the tests' database, not the demo's.
func noSchema(err error, dbURL string) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P01" {
		shown := dbURL
		if u, perr := url.Parse(dbURL); perr == nil {
			shown = u.Redacted()
		}
		return fmt.Errorf("%s has no usher tables (%s): is --database-url (DATABASE_URL) right? A new database needs `host migrate`; the demo prints the flags that read its own", shown, pg.Message)
	}
	return err
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

func (cl *cli) deadLetterCommands() []*command {
	return []*command{
		{name: "list", summary: "the open dead letters, oldest first", flags: cl.deadLettersList},
		{name: "show", args: "ID", summary: "one dead letter, whole", flags: cl.deadLettersShow},
		{name: "requeue", args: "ID... | --kind KIND", summary: "put dead letters (one or more IDs, all or none), or every open one of a kind, back through the outbox, identity kept", flags: cl.deadLettersRequeue},
		{name: "discard", args: "ID", summary: "discard a dead letter: kept in its job's history, no longer open", flags: cl.deadLettersDiscard},
	}
}

// withPool connects to the database conn names for the duration of f.
func withPool(ctx context.Context, conn *connFlags, f func(*pgxpool.Pool) error) error {
	pool, err := pgxpool.New(ctx, conn.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		if msg, full := sandbox.TooManyConnections(err); full {
			return fmt.Errorf("postgres refused the connection: no connection slot left (%s, SQLSTATE 53300); see docs/operating.md, \"Connection budget\"", msg)
		}
		return fmt.Errorf("cannot connect to postgres: %w", err)
	}
	return noSchema(f(pool), conn.databaseURL)
}

// letterShown is a dead letter as list and show print it. Attempts
// counts the job's attempts; Attempt is the last one's number, as the job
// history numbers them (0 the first run).
type letterShown struct {
	ID         int64           `json:"id"`
	JobID      string          `json:"job_id"`
	Kind       string          `json:"kind"`
	Payload    string          `json:"payload"`
	RequestID  string          `json:"request_id"`
	Trace      string          `json:"trace"`
	Reason     string          `json:"reason"`
	LastError  string          `json:"last_error"`
	Attempts   int             `json:"attempts"`
	Attempt    int             `json:"attempt"`
	StreamID   string          `json:"stream_id"`
	History    json.RawMessage `json:"history"`
	CreatedAt  time.Time       `json:"created_at"`
	RequeuedAt *time.Time      `json:"requeued_at"`
	Raw        []rawShown      `json:"raw,omitempty"`
}

func shown(l deadletter.Letter) letterShown {
	s := letterShown{ID: l.ID, JobID: l.JobID, Kind: l.Kind, Payload: showBytes(l.Payload, len(l.Payload)),
		RequestID: l.RequestID, Trace: l.Trace, Reason: l.Reason, LastError: l.LastError,
		Attempts: l.Attempts, Attempt: l.Attempt(), StreamID: l.StreamID, History: l.History, CreatedAt: l.CreatedAt, RequeuedAt: l.RequeuedAt}
	if len(s.History) == 0 {
		s.History = json.RawMessage("null")
	}
	if l.Raw != nil {
		s.Raw = showRaw(l.Raw)
	}
	return s
}

func (cl *cli) deadLettersList(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	kind := fs.String("kind", "", "only letters of this kind")
	limit := fs.Int("limit", 50, "at most this many")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("deadletters list takes no arguments, got %q", pos)}
		}
		if *limit <= 0 {
			return usageError{fmt.Sprintf("--limit must be positive, got %d", *limit)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			letters, err := deadletter.List(ctx, pool, *kind, *limit)
			if err != nil {
				return err
			}
			if *asJSON {
				out := make([]letterShown, 0, len(letters))
				for _, l := range letters {
					out = append(out, shown(l))
				}
				return writeJSON(cl.stdout, out)
			}
			if len(letters) == 0 {
				if *kind != "" {
					_, err := fmt.Fprintf(cl.stdout, "no open dead letters of kind %s\n", *kind)
					return err
				}
				_, err := fmt.Fprintln(cl.stdout, "no open dead letters")
				return err
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tJOB\tKIND\tLAST ATTEMPT\tAGE\tREASON")
			for _, l := range letters {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", l.ID, l.JobID, l.Kind, ops.Attempt(l.Attempt()),
					ops.HumanDuration(cl.now().Sub(l.CreatedAt).Round(time.Second)), truncate(l.Reason, 100))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if len(letters) < *limit {
				return nil
			}
			total, _, err := deadletter.CountOpen(ctx, pool, *kind, 0)
			if err != nil || total <= int64(len(letters)) {
				return err
			}
			// Cut: say so, and how to see the rest.
			_, err = fmt.Fprintf(cl.stdout, "the oldest %d of %d open dead letters: --limit %d shows them all\n", len(letters), total, total)
			return err
		})
	}
}

func (cl *cli) deadLettersShow(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		id, err := idArg("show", pos)
		if err != nil {
			return err
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			l, err := deadletter.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			s := shown(l)
			if *asJSON {
				return writeJSON(cl.stdout, s)
			}
			return s.print(cl.stdout, cl.now())
		})
	}
}

func (s letterShown) print(out io.Writer, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	requeued := "no"
	if s.RequeuedAt != nil {
		requeued = s.RequeuedAt.UTC().Format(time.RFC3339)
	}
	for _, f := range [][2]string{
		{"id", strconv.FormatInt(s.ID, 10)}, {"job", s.JobID}, {"kind", s.Kind}, {"last attempt", ops.Attempt(s.Attempt)},
		{"created", fmt.Sprintf("%s (%s ago)", s.CreatedAt.UTC().Format(time.RFC3339), ops.HumanDuration(now.Sub(s.CreatedAt).Round(time.Second)))},
		{"requeued", requeued}, {"stream id", s.StreamID}, {"request id", s.RequestID}, {"trace", s.Trace},
		{"reason", s.Reason}, {"last error", s.LastError}, {"payload", s.Payload}, {"history", string(s.History)},
	} {
		fmt.Fprintf(w, "%s\t%s\n", f[0], f[1])
	}
	for _, r := range s.Raw {
		cut := ""
		if r.Cut {
			cut = ", cut"
		}
		fmt.Fprintf(w, "raw %s\t%s (%d bytes%s)\n", r.Field, r.Value, r.Bytes, cut)
	}
	return w.Flush()
}

func (cl *cli) deadLettersRequeue(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	kind := fs.String("kind", "", "requeue every open letter of this kind (instead of IDs)")
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	return func(ctx context.Context, pos []string) error {
		var ids []int64
		switch {
		case *kind != "" && len(pos) > 0:
			return usageError{fmt.Sprintf("deadletters requeue takes IDs or --kind, not both (got %q and --kind %s)", pos, *kind)}
		case *kind == "" && len(pos) == 0:
			return usageError{"deadletters requeue takes one or more dead letter IDs, or --kind KIND"}
		case *kind == "":
			var err error
			if ids, err = jobctl.ParseIDs(pos); err != nil {
				return usageError{err.Error()}
			}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			var jobs []string
			var err error
			if len(ids) > 0 {
				jobs, err = jobctl.Requeue(ctx, pool, ids, *by)
			} else {
				jobs, err = jobctl.RequeueKind(ctx, pool, *kind, *by)
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "requeued %d dead letter(s) through the outbox, identities kept\n", len(jobs))
			return err
		})
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

func idArg(cmd string, pos []string) (int64, error) {
	if len(pos) != 1 {
		return 0, usageError{fmt.Sprintf("deadletters %s takes one dead letter ID, got %q", cmd, pos)}
	}
	id, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError{fmt.Sprintf("%q is not a dead letter ID", pos[0])}
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

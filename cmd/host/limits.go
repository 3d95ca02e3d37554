package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/limits"
)

const limitHelp = `A kind's limits hold across every host of the group: --concurrency N
lets at most N of its jobs run at once, --rate R/s (or /m, /h) lets at
most R start a second, in bursts of at most --burst (default one
second's worth). A job held back waits in the stream, its delivery given
back: it is not an attempt, is never dead-lettered for waiting, and runs
when a permit or a token is free. Each host reads the limits every second
(host.Config's PausePollInterval): a change needs no restart. A limit
replaces the kind's earlier limits whole; unlimit removes them. Each
change is recorded in operator_actions, with --by and the database login.`

// limitCommands are kinds limit, unlimit and limits.
func (cl *cli) limitCommands() []*command {
	return []*command{
		{name: "limits", summary: "the kinds' concurrency and rate limits", flags: cl.kindsLimits},
		{name: "limit", args: "KIND", summary: "limit KIND across every host: --concurrency N, --rate R/s", help: limitHelp, flags: cl.kindsLimit},
		{name: "unlimit", args: "KIND", summary: "remove KIND's limits", help: limitHelp, flags: cl.kindsUnlimit},
	}
}

func (cl *cli) kindsLimit(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	conc := fs.Int("concurrency", 0, "at most this many of KIND's jobs running at once across every host (0: no such limit)")
	rate := fs.String("rate", "", "at most this many starts across every host, as 10/s, 600/m or 3600/h (empty: no such limit)")
	burst := fs.Int("burst", 0, "with --rate: at most this many starts at once (default the rate's one second, at least 1)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("kinds limit takes one kind, got %q", pos)}
		}
		l := limits.Limit{Kind: pos[0], Concurrency: *conc, Burst: *burst}
		switch {
		case *conc < 0:
			return usageError{fmt.Sprintf("--concurrency must be positive, got %d", *conc)}
		case *burst < 0:
			return usageError{fmt.Sprintf("--burst must be positive, got %d", *burst)}
		case *burst > 0 && *rate == "":
			return usageError{"--burst needs --rate"}
		}
		if *rate != "" {
			r, err := limits.ParseRate(*rate)
			if err != nil {
				return usageError{"--" + err.Error()}
			}
			l.Rate = r
		}
		if l.Concurrency == 0 && l.Rate == 0 {
			return usageError{"kinds limit needs --concurrency, --rate or both (kinds unlimit removes a kind's limits)"}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			l, err := limits.Set(ctx, pool, l, *by)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "limited %s to %s: every host holds it within a second\n", l.Kind, l)
			return err
		})
	}
}

func (cl *cli) kindsUnlimit(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	by := fs.String("by", actingOperator(), "who acts, as the operator actions record it")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("kinds unlimit takes one kind, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			changed, err := limits.Unset(ctx, pool, pos[0], *by)
			if err != nil {
				return err
			}
			if !changed {
				_, err = fmt.Fprintf(cl.stdout, "%s had no limit\n", pos[0])
				return err
			}
			_, err = fmt.Fprintf(cl.stdout, "removed %s's limits: every host starts its jobs unlimited within a second\n", pos[0])
			return err
		})
	}
}

func (cl *cli) kindsLimits(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.registerDB(fs)
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, pos []string) error {
		if len(pos) > 0 {
			return usageError{fmt.Sprintf("kinds limits takes no arguments, got %q", pos)}
		}
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			list, err := limits.List(ctx, pool)
			if err != nil {
				return err
			}
			if *asJSON {
				if list == nil {
					list = []limits.Limit{}
				}
				return writeJSON(cl.stdout, list)
			}
			if len(list) == 0 {
				_, err = fmt.Fprintln(cl.stdout, "no kind is limited")
				return err
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tCONCURRENCY\tRATE\tBURST\tSINCE\tBY")
			for _, l := range list {
				c, r, b := "-", "-", "-"
				if l.Concurrency > 0 {
					c = strconv.Itoa(l.Concurrency)
				}
				if l.Rate > 0 {
					r, b = strconv.FormatFloat(l.Rate, 'f', -1, 64)+"/s", strconv.Itoa(l.Burst)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Kind, c, r, b, l.SetAt.UTC().Format(time.RFC3339), l.SetBy)
			}
			return w.Flush()
		})
	}
}

// printLimited is inspect's section of limited kinds, shown only when
// there are any (host kinds limit).
func printLimited(out io.Writer, list []limits.Limit) error {
	if len(list) == 0 {
		return nil
	}
	fmt.Fprintln(out, "\nlimited kinds (across every host)")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  KIND\tLIMITS\tSINCE\tBY")
	for _, l := range list {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", l.Kind, l, l.SetAt.UTC().Format(time.RFC3339), l.SetBy)
	}
	return w.Flush()
}

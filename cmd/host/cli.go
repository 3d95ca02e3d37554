package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/usherhq/usher/host"
)

// cli is one invocation of the host command: where it writes and what time
// it is (the golden tests fix both).
type cli struct {
	stdout, stderr io.Writer
	now            func() time.Time
}

// runner runs a leaf command with its positional arguments, once its flags
// are parsed.
type runner func(ctx context.Context, pos []string) error

// command is one node of the command tree: a group of subcommands, or a
// leaf with its flags. Flags are parsed wherever they stand on the command
// line, before or after the command names and positional arguments; "--"
// ends them.
type command struct {
	name    string
	args    string // the positional arguments, for the usage line: "ID", "[NAME]"
	summary string
	help    string // printed under the summary by -h
	// flags registers the leaf's flags on fs and returns what runs it.
	flags func(fs *flag.FlagSet) runner
	subs  []*command
	dflt  string // the subcommand a group runs when none is named
}

func (c *command) sub(name string) *command {
	for _, s := range c.subs {
		if s.name == name {
			return s
		}
	}
	return nil
}

// usageError is a command line the CLI does not accept: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func pathName(path []*command) string {
	names := make([]string, len(path))
	for i, c := range path {
		names[i] = c.name
	}
	return strings.Join(names, " ")
}

// badFlag turns the flag package's parse error into a usageError that
// names the command and where its flags are listed.
func badFlag(path []*command, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + name
	}
	if len(path) > 1 {
		msg = pathName(path[1:]) + ": " + msg
	}
	return usageError{fmt.Sprintf("%s (run '%s -h' for its flags)", msg, pathName(path))}
}

// parseInterspersed parses fs's flags wherever they stand in args and
// returns the other arguments in order. After "--" everything is
// positional. On an error (flag.ErrHelp included) it returns the
// positional arguments seen before it.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return pos, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, help printed by printHelp
	fs.Usage = func() {}
	return fs
}

// allFlags is a flag set holding every flag of every leaf under c, to find
// the command names among flags that take values.
func allFlags(c *command) *flag.FlagSet {
	all := newFlagSet(c.name)
	var add func(*command)
	add = func(c *command) {
		if c.flags != nil {
			fs := newFlagSet(c.name)
			c.flags(fs)
			fs.VisitAll(func(f *flag.Flag) {
				prev := all.Lookup(f.Name)
				if prev == nil {
					all.Var(f.Value, f.Name, f.Usage)
				} else if isBool(prev) != isBool(f) {
					// Commands would be found in the wrong places.
					panic(fmt.Sprintf("flag --%s takes a value in one command and not in another", f.Name))
				}
			})
		}
		for _, s := range c.subs {
			add(s)
		}
	}
	add(c)
	return all
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// exec runs the command args name under root. -h or --help anywhere
// prints the help of the command named before it and returns
// flag.ErrHelp.
func (cl *cli) exec(ctx context.Context, root *command, args []string) error {
	path := []*command{root}
	names := 0 // the positional arguments that named commands
	for cur := root; cur.subs != nil; {
		pos, err := parseInterspersed(allFlags(cur), args)
		if err != nil {
			// Name the command the user was writing.
			for _, name := range pos[min(names, len(pos)):] {
				s := path[len(path)-1].sub(name)
				if s == nil {
					break
				}
				path = append(path, s)
			}
			if errors.Is(err, flag.ErrHelp) {
				cl.printHelp(path)
				return err
			}
			return badFlag(path, err)
		}
		name := cur.dflt
		if len(pos) > names {
			name = pos[names]
			names++
		}
		if name == "help" {
			cl.printHelp(path)
			return flag.ErrHelp
		}
		next := cur.sub(name)
		if next == nil {
			where := pathName(path[1:])
			msg := strings.TrimSpace(where + " needs a command")
			if name != "" {
				msg = fmt.Sprintf("unknown command %q", strings.TrimSpace(where+" "+name))
			}
			return usageError{msg + "\n" + cl.commandList(cur) + fmt.Sprintf("run '%s -h' for more", pathName(path))}
		}
		path, cur = append(path, next), next
	}
	leaf := path[len(path)-1]
	fs := newFlagSet(pathName(path))
	run := leaf.flags(fs)
	if err := applyEnv(fs); err != nil {
		return usageError{fmt.Sprintf("%s: %v", pathName(path[1:]), err)}
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		cl.printHelp(path)
		return err
	}
	if err != nil {
		return badFlag(path, err)
	}
	if err := refuseSecretArgs(fs); err != nil {
		return err
	}
	return run(ctx, pos[names:])
}

func (cl *cli) commandList(c *command) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "commands:")
	for _, s := range c.subs {
		fmt.Fprintf(w, "  %s\t%s\n", strings.TrimSpace(s.name+" "+s.args), s.summary)
	}
	w.Flush()
	return b.String()
}

// printHelp prints the help of the last command of path on stdout: it was
// asked for.
func (cl *cli) printHelp(path []*command) {
	c, name := path[len(path)-1], pathName(path)
	if c.subs != nil {
		fmt.Fprintf(cl.stdout, "usage: %s <command> [flags]\n\n", name)
		if c.summary != "" {
			fmt.Fprintf(cl.stdout, "%s\n\n", c.summary)
		}
		if c.help != "" {
			fmt.Fprintf(cl.stdout, "%s\n\n", c.help)
		}
		fmt.Fprint(cl.stdout, cl.commandList(c))
		fmt.Fprintf(cl.stdout, "\nFlags go before or after the command and its arguments. Run '%s <command> -h' for a command's flags.\n", name)
		return
	}
	fmt.Fprintf(cl.stdout, "usage: %s\n\n%s\n", strings.Join(strings.Fields(name+" "+c.args+" [flags]"), " "), c.summary)
	if c.help != "" {
		fmt.Fprintf(cl.stdout, "\n%s\n", c.help)
	}
	fs := newFlagSet(name)
	c.flags(fs)
	fmt.Fprintln(cl.stdout, "\nflags (before or after the arguments):")
	fs.VisitAll(func(f *flag.Flag) {
		g := *f
		if e, ok := f.Value.(envValue); ok {
			g.Value = e.Value
		}
		if _, ok := secretFlags[f.Name]; ok {
			// Its default may be the environment's URL: no password in help.
			g.DefValue = host.MaskURL(g.DefValue)
		}
		typ, usage := flag.UnquoteUsage(&g)
		fmt.Fprintf(cl.stdout, "  --%s", strings.TrimSpace(f.Name+" "+typ))
		switch {
		case g.DefValue == "" || g.DefValue == "0" || g.DefValue == "false" || g.DefValue == "0s":
		case typ == "string":
			usage += fmt.Sprintf(" (default %q)", g.DefValue)
		default:
			usage += fmt.Sprintf(" (default %s)", g.DefValue)
		}
		fmt.Fprintf(cl.stdout, "\n    \t%s\n", strings.ReplaceAll(usage, "\n", "\n    \t"))
	})
}

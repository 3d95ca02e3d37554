// Command host runs and operates usher.
//
//	host run          serve jobs (relay, consumer, reclaim, scheduler, plugins)
//	host setup        create the owner and plugin roles (once, as an administrator)
//	host setup-users  create an OS user for each plugin (once, as root)
//	host migrate      apply the runtime's migrations (--stagedoor: the example app's too)
//	host demo         the Stagedoor demo: everything, with faults, and a summary
//	host inspect      pending entries, backlog, dead letters, absorbed duplicates
//	host deadletters  list | show ID | requeue ID | requeue --kind KIND
//	host jobs         show ID: a job's state and every delivery's record
//	host workflows    show REQUEST_ID: the jobs one request started, as a tree (a durable
//	                  workflow's history first) | start TYPE ID [JSON] | signal TYPE ID SIGNAL_ID NAME [JSON]
//	                  | cancel TYPE ID [REASON] | list [--type T] [--state S] [--older-than D]
//	                  | migrate TYPE [ID...] (a running host, admin API)
//	host schedules    list | add NAME (--workflow TYPE | --job KIND) (--cron SPEC | --every D) | pause | resume | delete NAME
//	host plugins      list | reload [NAME] (a running host, admin API) | manifest BINARY | install [NAME] | init NAME
//
// Flags go anywhere on the command line, before or after the command, its
// subcommand and its arguments; an unknown flag is an error (exit status
// 2), -h or --help prints a command's flags (exit status 0). The read
// commands (inspect, deadletters list and show, jobs show, workflows show
// and list, plugins list) take --json.
//
// Configuration comes from flags, with environment variables as defaults:
// DATABASE_URL, REDIS_URL, USHER_STREAM, USHER_PLUGIN_DIR, USHER_CONSUMER,
// USHER_RECLAIM_IDLE, USHER_CONCURRENCY, USHER_ADMIN_ADDR,
// USHER_ADMIN_ALLOWED_HOSTS, USHER_SIGNING_KEY_FILE, USHER_REDIS_CA_FILE,
// USHER_REDIS_PASSWORD_FILE, USHER_PLUGIN_USER, USHER_PLUGIN_POOL_SIZE. A
// URL flag holding a password is refused, since a command line is visible
// to every user (the password goes in REDIS_URL, --redis-password-file or
// PGPASSFILE), and so is a secret file group or others may read. The admin
// API's token is USHER_ADMIN_TOKEN (never a flag), else the file
// --admin-token-file names (default $XDG_STATE_HOME/usher/admin-token);
// `run` creates that file when it is missing, `plugins` reads it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	cl := &cli{stdout: os.Stdout, stderr: os.Stderr, now: time.Now}
	os.Exit(cl.main(os.Args[1:]))
}

// main runs the command line args and returns the exit status: 0, 1 when
// the command failed, 2 when the command line is wrong.
func (cl *cli) main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cl.run(ctx, args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	// The library's errors say "host: " already: printed once.
	fmt.Fprintln(cl.stderr, "host:", strings.TrimPrefix(err.Error(), "host: "))
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

func (cl *cli) run(ctx context.Context, args []string) error {
	return cl.exec(ctx, cl.commands(), args)
}

// commands is the command tree.
func (cl *cli) commands() *command {
	return &command{name: "host", summary: "usher's host: serve jobs and operate them", subs: []*command{
		{name: "run", summary: "serve jobs", flags: cl.runFlags},
		{name: "setup", summary: "create the runtime's owner role and the plugins' login roles (once, as a database administrator)", flags: cl.setupFlags},
		{name: "setup-users", summary: "create an OS user of its own for each plugin, for run --plugin-user usher-p-{name} (once, as root)", flags: cl.setupUsersFlags},
		{name: "migrate", summary: "apply the runtime's database migrations (--stagedoor: and the Stagedoor example's tables)", flags: cl.migrateFlags},
		{name: "demo", summary: "run the Stagedoor demo with faults injected and print a summary", flags: cl.demoFlags},
		{name: "inspect", summary: "show pending entries, backlog, dead letters and absorbed duplicates", flags: cl.inspectFlags},
		{name: "deadletters", summary: "list, show and requeue dead letters", subs: cl.deadLetterCommands()},
		{name: "jobs", summary: "enqueue a job, list jobs, and show one with the history of its deliveries", subs: cl.jobCommands()},
		{name: "wait", summary: "wait --idle: until nothing is pending, scheduled or unpublished (exit 1 after --timeout)", help: waitHelp, flags: cl.waitFlags},
		{name: "kinds", summary: "pause, resume and limit a kind on every host, and show the paused and limited ones", subs: cl.kindCommands()},
		{name: "schedules", summary: "recurring schedules that start a workflow or enqueue a job once per tick", dflt: "list", subs: cl.scheduleCommands()},
		{name: "workflows", summary: "durable workflows (start, signal, cancel, list) and the tree of jobs one request started", subs: cl.workflowCommands()},
		{name: "plugins", summary: "a running host's plugins (via its admin address), and plugin manifests", dflt: "list", subs: cl.pluginCommands()},
	}}
}

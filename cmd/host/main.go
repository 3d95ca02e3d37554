// Command host runs and operates usher.
//
//	host run          serve jobs (relay, consumer, reclaim, scheduler, plugins)
//	host setup        create the owner and plugin roles (once, as an administrator)
//	host migrate      apply the database migrations
//	host demo         the Stagedoor demo: everything, with faults, and a summary
//	host inspect      pending entries, backlog, dead letters, absorbed duplicates
//	host deadletters  list | show ID | requeue ID | requeue --kind KIND
//	host plugins      list | reload [NAME] (a running host, admin API) | manifest BINARY
//
// Configuration comes from flags, with environment variables as defaults:
// DATABASE_URL, REDIS_URL, USHER_STREAM, USHER_PLUGIN_DIR, USHER_CONSUMER,
// USHER_RECLAIM_IDLE, USHER_CONCURRENCY, USHER_ADMIN_ADDR,
// USHER_ADMIN_ALLOWED_HOSTS, USHER_SIGNING_KEY_FILE, USHER_REDIS_CA_FILE,
// USHER_PLUGIN_POOL_SIZE. The admin API's token is USHER_ADMIN_TOKEN
// (never a flag: a command line is visible to every user), else the file
// --admin-token-file names (default $XDG_STATE_HOME/usher/admin-token);
// `run` creates that file when it is missing, `plugins` reads it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "host:", err)
		os.Exit(1)
	}
}

const usage = `usage: host <command> [flags]

commands:
  run          serve jobs
  setup        create the runtime's owner role and the plugins' login roles (once, as a database administrator)
  migrate      apply database migrations
  demo         run the Stagedoor demo with faults injected and print a summary
  inspect      show pending entries, backlog, dead letters and absorbed duplicates
  deadletters  list | show ID | requeue ID | requeue --kind KIND
  plugins      list | reload [NAME] (a running host's plugins, via its admin address)
               | manifest BINARY --name N --version V [--write]

run 'host <command> -h' for the command's flags`

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, rest)
	case "setup":
		return cmdSetup(ctx, rest)
	case "migrate":
		return cmdMigrate(ctx, rest)
	case "demo":
		return cmdDemo(ctx, rest)
	case "inspect":
		return cmdInspect(ctx, rest)
	case "deadletters":
		return cmdDeadLetters(ctx, rest)
	case "plugins":
		return cmdPlugins(ctx, rest)
	case "-h", "--help", "help":
		fmt.Println(usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}

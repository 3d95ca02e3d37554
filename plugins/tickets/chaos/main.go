// Command chaos is the tickets plugin's chaos build: the shipped plugin
// (name tickets, the same kinds, handlers and environment) with
// faults.Middleware around every phase, so tests, the demo and the chaos
// suite can stall, crash or fail it at render.before_check ...
// send.after_effect through USHER_FAULT_DIR. make chaos-plugins builds it
// into bin/chaos-plugins/tickets. It is not for production: a fault armed
// in its directory crashes it on purpose.
package main

import (
	"fmt"
	"os"

	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/tickets/tickets"
	"github.com/usherhq/usher/sdk"
)

var version = "1.0.0"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tickets (chaos build):", err)
		os.Exit(1)
	}
}

func run() error {
	p, err := tickets.Plugin(version)
	if err != nil {
		return err
	}
	sdk.Use(p, faults.Middleware{})
	sdk.Serve(p)
	return nil
}

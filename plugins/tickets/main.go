// Command tickets is a handler plugin serving Stagedoor's ticket jobs:
//
//   - render_tickets (state first): check tickets.pdf_key, render the PDF
//     with no transaction open, store it under a key derived from the
//     order, and in the host's transaction write the key only where it is
//     still null; only the run whose write won queues send_tickets.
//   - send_tickets (claim the effect): the host claims email_sends
//     (order_id, kind); the effect sends through the mail provider with the
//     idempotency key tickets-<order id>; the host marks sent_at.
//
// Settings, passed with host run --plugin-env (docs/operating.md):
// USHER_BLOB_DIR (where PDFs are stored and sent from, required),
// MAILPROVIDER_URL (the mail provider's base URL, required),
// TICKETS_CLAIM_LEASE (the send claim's lease, default 2m). Without a
// required one it exits at start with an error naming it, which the host
// reports as the reason it did not load the plugin.
//
// plugins/tickets/chaos is the same plugin with faults injected from
// outside, for tests, the demo and the chaos suite.
package main

import (
	"fmt"
	"os"

	"github.com/usherhq/usher/plugins/tickets/tickets"
	"github.com/usherhq/usher/sdk"
)

var version = "1.0.0"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tickets:", err)
		os.Exit(1)
	}
}

func run() error {
	p, err := tickets.Plugin(version)
	if err != nil {
		return err
	}
	sdk.Serve(p)
	return nil
}

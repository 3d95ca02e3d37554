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
// Environment: USHER_BLOB_DIR (where PDFs are stored, default ./blobs),
// MAILPROVIDER_URL (default http://127.0.0.1:8025), TICKETS_CLAIM_LEASE
// (the send claim's lease, default 2m).
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/handlers"
	"github.com/usherhq/usher/plugins/tickets/mail"
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
	store, err := blob.NewFS(envOr("USHER_BLOB_DIR", "blobs"))
	if err != nil {
		return err
	}
	lease := sdk.DefaultLease
	if s := os.Getenv("TICKETS_CLAIM_LEASE"); s != "" {
		if lease, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("TICKETS_CLAIM_LEASE: %w", err)
		}
	}
	mailer := &mail.Client{BaseURL: envOr("MAILPROVIDER_URL", "http://127.0.0.1:8025"),
		HTTP: &http.Client{Timeout: 10 * time.Second}}
	p := sdk.New("tickets", version)
	sdk.HandleStateFirst(p, &handlers.Render{Store: store})
	sdk.HandleClaim(p, &handlers.Send{Store: store, Mailer: mailer, Lease: lease})
	sdk.Serve(p)
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

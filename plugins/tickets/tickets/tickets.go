// Package tickets builds the tickets plugin from its environment, for its
// shipped main (plugins/tickets) and its chaos build (plugins/tickets/chaos)
// alike, so the two serve the same handlers.
package tickets

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

// Plugin registers render_tickets and send_tickets, configured from the
// environment: USHER_BLOB_DIR (where PDFs are stored, default ./blobs),
// MAILPROVIDER_URL (default http://127.0.0.1:8025), TICKETS_CLAIM_LEASE
// (the send claim's lease, default 2m).
func Plugin(version string) (*sdk.Plugin, error) {
	store, err := blob.NewFS(envOr("USHER_BLOB_DIR", "blobs"))
	if err != nil {
		return nil, err
	}
	lease := sdk.DefaultLease
	if s := os.Getenv("TICKETS_CLAIM_LEASE"); s != "" {
		if lease, err = time.ParseDuration(s); err != nil {
			return nil, fmt.Errorf("TICKETS_CLAIM_LEASE: %w", err)
		}
	}
	mailer := &mail.Client{BaseURL: envOr("MAILPROVIDER_URL", "http://127.0.0.1:8025"),
		HTTP: &http.Client{Timeout: 10 * time.Second}}
	p := sdk.New("tickets", version)
	sdk.HandleStateFirst(p, &handlers.Render{Store: store})
	sdk.HandleClaim(p, &handlers.Send{Store: store, Mailer: mailer, Lease: lease})
	return p, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

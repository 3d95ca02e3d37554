// Package tickets builds the tickets plugin from its environment, for its
// shipped main (plugins/tickets) and its chaos build (plugins/tickets/chaos)
// alike, so the two serve the same handlers.
package tickets

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/handlers"
	"github.com/usherhq/usher/plugins/tickets/mail"
	"github.com/usherhq/usher/sdk"
)

// The plugin's settings, which a host passes it with `host run
// --plugin-env NAME=VALUE` (docs/operating.md, "The commands").
const (
	// BlobDirEnv is the directory rendered PDFs are stored in and sent
	// from: every host that runs tickets must see the same one. Required.
	BlobDirEnv = "USHER_BLOB_DIR"
	// MailURLEnv is the mail provider's base URL (cmd/mailprovider's,
	// http://127.0.0.1:8025 by default). Required.
	MailURLEnv = "MAILPROVIDER_URL"
	// ClaimLeaseEnv is the send claim's lease, a Go duration. Default
	// sdk.DefaultLease (2m).
	ClaimLeaseEnv = "TICKETS_CLAIM_LEASE"
)

// Plugin registers render_tickets and send_tickets, configured from the
// environment (BlobDirEnv, MailURLEnv, ClaimLeaseEnv). A required setting
// that is missing is an error naming it, so the plugin stops at start and
// the host says why, rather than storing PDFs wherever the host runs; when
// the host only reads the manifest (sdk.ManifestOnly) none is needed.
func Plugin(version string) (*sdk.Plugin, error) {
	lease := sdk.DefaultLease
	if s := os.Getenv(ClaimLeaseEnv); s != "" {
		var err error
		if lease, err = time.ParseDuration(s); err != nil {
			return nil, fmt.Errorf("%s: %w", ClaimLeaseEnv, err)
		}
	}
	var store *blob.FS
	var mailer *mail.Client
	if !sdk.ManifestOnly() {
		dir, mailURL := os.Getenv(BlobDirEnv), os.Getenv(MailURLEnv)
		var missing []error
		if dir == "" {
			missing = append(missing, notSet(BlobDirEnv, "DIR", "the directory rendered PDFs are stored in and sent from, the same for every host that runs tickets"))
		}
		if mailURL == "" {
			missing = append(missing, notSet(MailURLEnv, "URL", "the mail provider's base URL"))
		}
		if len(missing) > 0 {
			return nil, errors.Join(missing...)
		}
		var err error
		if store, err = blob.NewFS(dir); err != nil {
			return nil, err
		}
		mailer = &mail.Client{BaseURL: mailURL, HTTP: &http.Client{Timeout: 10 * time.Second}}
	}
	p := sdk.New("tickets", version)
	sdk.HandleStateFirst(p, &handlers.Render{Store: store})
	sdk.HandleClaim(p, &handlers.Send{Store: store, Mailer: mailer, Lease: lease})
	return p, nil
}

func notSet(name, value, what string) error {
	return fmt.Errorf("%s is not set (%s): pass it with host run --plugin-env %s=%s (docs/operating.md)", name, what, name, value)
}

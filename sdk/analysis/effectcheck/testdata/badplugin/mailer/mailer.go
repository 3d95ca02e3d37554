// Package mailer is a provider client: Send leaves the process.
package mailer

import (
	"context"
	"net/http"

	"github.com/usherhq/usher/sdk"
)

// Client sends mail.
type Client struct{ HTTP *http.Client }

// Send posts one message under key.
func (c *Client) Send(ctx context.Context, key sdk.IdempotencyKey, body []byte) error { // want Send:`effect: network call sdk.NewProviderRequest` Send:`key reaches sdk.NewProviderRequest from parameters \[2\]`
	req, err := sdk.NewProviderRequest(ctx, http.MethodPost, "http://mail.invalid/v1/messages", body, key)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Describe names key for a log line; it sends nothing.
func (c *Client) Describe(key sdk.IdempotencyKey) string { return "message " + key.String() }

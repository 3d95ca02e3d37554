// Package provclient is a provider's own client library: it knows nothing
// of usher and takes the idempotency key as a string. usher-vet does not
// follow it (it does not import the SDK) and trusts it with the key.
package provclient

import (
	"context"
	"net/http"
)

// Refund asks for a refund under key.
func Refund(ctx context.Context, key string) error { // want Refund:`effect: network call`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.invalid/v1/refunds", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

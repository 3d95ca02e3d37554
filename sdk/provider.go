package sdk

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
)

// IdempotencyKey is the key a provider call carries so that the provider can
// deduplicate what usher cannot see: a send that left the process before the
// run that made it could record it.
//
// A key is the intent translated into the provider's vocabulary ("the ticket
// email for order 4471" becomes "tickets-4471") and is identical on every
// attempt of the job. Its zero value is invalid, and the only way to obtain
// a valid one is from the claim the host granted (the key [ClaimEffect]'s
// Effect receives), so a per-attempt key (a random UUID, a timestamp)
// cannot be passed by mistake.
type IdempotencyKey struct {
	value string
}

// String returns the key as sent to the provider.
func (k IdempotencyKey) String() string { return k.value }

// Valid reports whether the key was derived from an intent.
func (k IdempotencyKey) Valid() bool { return k.value != "" }

// intentKey derives the key from a claim's intent. It is unexported on
// purpose: handlers receive keys, they never build them.
func intentKey(intent string) (IdempotencyKey, error) {
	intent = strings.TrimSpace(intent)
	if intent == "" {
		return IdempotencyKey{}, fmt.Errorf("sdk: claim has no intent: an idempotency key must be derived from the job's intent")
	}
	if len(intent) > 255 {
		return IdempotencyKey{}, fmt.Errorf("sdk: intent %q is longer than 255 bytes", intent[:32]+"...")
	}
	return IdempotencyKey{value: intent}, nil
}

// IdempotencyHeader is the HTTP header that carries the key, as the mail
// provider of the Stagedoor demo (cmd/mailprovider) expects it, like
// providers that follow the IETF Idempotency-Key header draft.
const IdempotencyHeader = "Idempotency-Key"

// NewProviderRequest builds an HTTP request to a provider that carries key in
// the Idempotency-Key header. It is the SDK's provider call path: it refuses
// a key that was not derived from an intent.
func NewProviderRequest(ctx context.Context, method, url string, body []byte, key IdempotencyKey) (*http.Request, error) {
	if !key.Valid() {
		return nil, fmt.Errorf("sdk: provider request to %s without an idempotency key derived from the intent", url)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("sdk: build provider request: %w", err)
	}
	req.Header.Set(IdempotencyHeader, key.value)
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

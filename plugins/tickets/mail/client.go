// Package mail is the tickets plugin's client of the transactional-mail
// provider (in development and tests, the fake one in cmd/mailprovider).
//
// Every send carries an [sdk.IdempotencyKey] derived from the job's intent,
// so a retry of a send whose outcome was lost (a timeout, a 5xx after the
// message left) is deduplicated by the provider: it answers with the first
// send's receipt instead of mailing again.
package mail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/usherhq/usher/sdk"
)

// ErrRejected is wrapped by the error of a request the provider refused for
// good (a 4xx other than 408, 409 and 429: a bad request, a body too large,
// an idempotency key reused with another message). Retrying it unchanged
// fails the same way; test with errors.Is.
var ErrRejected = errors.New("mail: provider rejected the request")

// maxResponseBytes bounds how much of a provider response is read.
const maxResponseBytes = 64 << 20

// Client talks to the mail provider's HTTP API.
type Client struct {
	// BaseURL is the provider's root, such as "http://127.0.0.1:8025".
	BaseURL string
	// HTTP is the client used for requests; nil means http.DefaultClient.
	// Set a Timeout on it, or pass a context with a deadline.
	HTTP *http.Client
}

// Message is an email to send. Its JSON encoding follows the field order,
// so the same Message always gives the same request body, and so the same
// identity at the provider.
type Message struct {
	// To is the recipient address.
	To string `json:"to"`
	// Subject is the subject line.
	Subject string `json:"subject"`
	// Text is the plain-text body.
	Text string `json:"text"`
	// Attachments are referenced by name and content hash. A nil and an
	// empty slice encode the same way.
	Attachments []Attachment `json:"attachments,omitempty"`
}

// Attachment names a file attached to a Message.
type Attachment struct {
	// Name is the file name shown to the recipient.
	Name string `json:"name"`
	// SHA256 is the hex SHA-256 of the file's content.
	SHA256 string `json:"sha256"`
}

// Receipt is the provider's answer to a send.
type Receipt struct {
	// ID is the provider's message id ("msg_...").
	ID string
	// Replayed is true when the provider had already sent a message under
	// this key and this answer is the first one repeated: nothing new left.
	Replayed bool
}

// SentMessage is an entry of the fake provider's sent log.
type SentMessage struct {
	// ID is the message id the send was answered with.
	ID string `json:"id"`
	// IdempotencyKey is the key the message was sent under.
	IdempotencyKey string `json:"idempotency_key"`
	// BodySHA256 is the hex SHA-256 of the request body.
	BodySHA256 string `json:"body_sha256"`
	// To is the recipient address.
	To string `json:"to"`
	// Subject is the subject line.
	Subject string `json:"subject"`
	// SentAt is when the provider sent the message.
	SentAt time.Time `json:"sent_at"`
}

// Stats are the fake provider's counters. Sent counts the whole durable
// sent log; the others count since the provider process started.
type Stats struct {
	// Sent is the number of messages sent.
	Sent int `json:"sent"`
	// Replayed is the number of requests answered with a stored response.
	Replayed int `json:"replayed"`
	// Conflicts is the number of requests refused because their key had
	// been used with another body.
	Conflicts int `json:"conflicts"`
	// FailedInjected is the number of requests failed on purpose.
	FailedInjected int `json:"failed_injected"`
}

// Faults is the fake provider's fault plan. Setting it replaces the whole
// plan; a zero Faults clears it.
type Faults struct {
	// FailNext message requests fail with FailStatus before sending.
	FailNext int `json:"fail_next"`
	// FailStatus is the status of those failures; 0 means 503.
	FailStatus int `json:"fail_status"`
	// DelayNext message requests are held DelayMS milliseconds before
	// being handled; a client that gives up meanwhile leaves nothing sent.
	DelayNext int `json:"delay_next"`
	// DelayMS is the length of those delays in milliseconds.
	DelayMS int `json:"delay_ms"`
	// FailAfterSendNext sends are made and recorded, then answered with
	// 500: the client sees an error although the message left.
	FailAfterSendNext int `json:"fail_after_send_next"`
}

// StatusError is a non-2xx answer of the provider. Permanent ones unwrap
// to ErrRejected.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Message is the provider's error text (its "error" field, or the raw
	// body when that is not JSON).
	Message string
}

// Error reports the status and the provider's text.
func (e *StatusError) Error() string {
	verb := "answered"
	if e.Permanent() {
		verb = "rejected the request with"
	}
	return fmt.Sprintf("mail provider %s %d %s: %s",
		verb, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// Permanent reports whether retrying the same request cannot succeed: a
// 4xx other than 408 (timeout), 409 (in progress) and 429 (rate limited).
func (e *StatusError) Permanent() bool {
	switch e.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return false
	}
	return e.StatusCode >= 400 && e.StatusCode < 500
}

// Unwrap returns ErrRejected for a permanent error, so that
// errors.Is(err, ErrRejected) tells callers not to retry.
func (e *StatusError) Unwrap() error {
	if e.Permanent() {
		return ErrRejected
	}
	return nil
}

// Send asks the provider to send m under key. Sending again with the same
// key and the same message does not send twice: the provider answers with
// the first receipt and Replayed set. The same key with a different message
// is an error wrapping ErrRejected.
//
// An error that does not wrap ErrRejected (a transport error, a timeout, a
// 5xx) leaves the outcome unknown: the message may have left. Retry with
// the same key.
func (c *Client) Send(ctx context.Context, key sdk.IdempotencyKey, m Message) (Receipt, error) {
	body, err := EncodeMessage(m)
	if err != nil {
		return Receipt{}, err
	}
	req, err := sdk.NewProviderRequest(ctx, http.MethodPost, c.url("/v1/messages"), body, key)
	if err != nil {
		return Receipt{}, fmt.Errorf("mail: send: %w", err)
	}
	var out struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	resp, err := c.do(req, &out)
	if err != nil {
		return Receipt{}, fmt.Errorf("mail: send with key %s: %w", key, err)
	}
	if out.ID == "" {
		return Receipt{}, fmt.Errorf("mail: send with key %s: provider answered %d without a message id", key, resp.StatusCode)
	}
	return Receipt{ID: out.ID, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

// EncodeMessage returns the request body Send sends for m. It is
// deterministic: equal messages give equal bytes.
func EncodeMessage(m Message) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("mail: encode message: %w", err)
	}
	return b, nil
}

// Messages returns the fake provider's sent log, in send order.
func (c *Client) Messages(ctx context.Context) ([]SentMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/_admin/messages"), nil)
	if err != nil {
		return nil, fmt.Errorf("mail: messages: %w", err)
	}
	var out struct {
		Count    int           `json:"count"`
		Messages []SentMessage `json:"messages"`
	}
	if _, err := c.do(req, &out); err != nil {
		return nil, fmt.Errorf("mail: messages: %w", err)
	}
	return out.Messages, nil
}

// Stats returns the fake provider's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/_admin/stats"), nil)
	if err != nil {
		return Stats{}, fmt.Errorf("mail: stats: %w", err)
	}
	var out Stats
	if _, err := c.do(req, &out); err != nil {
		return Stats{}, fmt.Errorf("mail: stats: %w", err)
	}
	return out, nil
}

// SetFaults replaces the fake provider's fault plan with f.
func (c *Client) SetFaults(ctx context.Context, f Faults) error {
	body, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("mail: set faults: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/_admin/faults"), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("mail: set faults: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if _, err := c.do(req, nil); err != nil {
		return fmt.Errorf("mail: set faults: %w", err)
	}
	return nil
}

func (c *Client) url(path string) string {
	return strings.TrimRight(c.BaseURL, "/") + path
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// do runs req and decodes a 2xx JSON answer into out (when out is not nil).
// A non-2xx answer is a *StatusError.
func (c *Client) do(req *http.Request, out any) (*http.Response, error) {
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("read %d response: %w", resp.StatusCode, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &StatusError{StatusCode: resp.StatusCode, Message: errorText(data)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, fmt.Errorf("decode %d response: %w", resp.StatusCode, err)
		}
	}
	return resp, nil
}

// errorText extracts the provider's error message from a response body.
func errorText(data []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return e.Error
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "(empty body)"
	}
	const limit = 512
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return s
}

package badplugin

import (
	"context"
	"fmt"
	"net/http"

	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/mailer"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/provclient"
)

// The claim effects below each use their key; usher-vet follows it (SSA)
// and reports those where it never reaches the provider call.

// LoggedKey logs its key and sends with another: used, never sent.
type LoggedKey struct{ Mailer *mailer.Client }

func (s *LoggedKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *LoggedKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want `LoggedKey.Effect never sends its idempotency key key to the provider: it is used, but reaches no provider call` Effect:`effect: network call`
	job.Log.Info("sending", "key", key.String())
	return s.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil)
}

// HelperLogsKey hands its key to a helper of its own, which only logs it:
// passed to a function is not passed to the provider.
type HelperLogsKey struct{ Mailer *mailer.Client }

func (s *HelperLogsKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *HelperLogsKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want `HelperLogsKey.Effect never sends its idempotency key key to the provider` Effect:`effect: network call`
	remember(job, key)
	return s.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil)
}

func remember(job sdk.Job[Order], key sdk.IdempotencyKey) {
	job.Log.Debug("claimed", "key", fmt.Sprint(key))
}

// FieldKey carries its key in a struct to a method that sends it: clean.
type FieldKey struct{ Mailer *mailer.Client }

type outgoing struct {
	Key  sdk.IdempotencyKey
	Body []byte
}

func (s *FieldKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *FieldKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want Effect:`effect: network call` Effect:`key reaches \(\*mailer.Client\).Send`
	return s.deliver(ctx, outgoing{Key: key, Body: []byte("{}")})
}

func (s *FieldKey) deliver(ctx context.Context, m outgoing) error { // want deliver:`effect: network call`
	return s.Mailer.Send(ctx, m.Key, m.Body)
}

// HeaderKey builds its own request and sets the key, as a string, on its
// header: clean.
type HeaderKey struct{ HTTP *http.Client }

func (s *HeaderKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *HeaderKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want Effect:`effect: network call` Effect:`key reaches \(http.Header\).Set`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mail.invalid/v1/messages", nil)
	if err != nil {
		return err
	}
	req.Header.Set(sdk.IdempotencyHeader, "mail-"+key.String())
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// ClosureKey sends from a function literal that captures its key: clean.
type ClosureKey struct{ Mailer *mailer.Client }

func (s *ClosureKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *ClosureKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want Effect:`effect: network call` Effect:`key reaches`
	send := func() error { return s.Mailer.Send(ctx, key, nil) }
	return send()
}

// DescribedKey hands its key to its provider client's Describe, which
// sends nothing (its facts say so), and logs what it answers.
type DescribedKey struct{ Mailer *mailer.Client }

func (s *DescribedKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "email_sends", Intent: "order-1"}, nil
}

func (s *DescribedKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want `DescribedKey.Effect never sends its idempotency key key to the provider` Effect:`effect: network call`
	job.Log.Info("sending", "message", s.Mailer.Describe(key))
	return s.Mailer.Send(ctx, sdk.IdempotencyKey{}, nil)
}

// ForeignClientKey passes its key, as a string, to a provider's own client
// library, which usher-vet does not follow: trusted, clean.
type ForeignClientKey struct{}

func (ForeignClientKey) Claim(job sdk.Job[Order]) (sdk.Claim, error) {
	return sdk.Claim{Table: "refund_claims", Intent: "refund-1"}, nil
}

func (ForeignClientKey) Effect(ctx context.Context, job sdk.Job[Order], db *sdk.ReadOnly, key sdk.IdempotencyKey) error { // want Effect:`effect: network call provclient.Refund` Effect:`key reaches provclient.Refund \(a client the analyzer does not follow\)`
	return provclient.Refund(ctx, key.String())
}

var (
	_ sdk.ClaimEffect[Order] = (*DescribedKey)(nil)
	_ sdk.ClaimEffect[Order] = ForeignClientKey{}
	_ sdk.ClaimEffect[Order] = (*LoggedKey)(nil)
	_ sdk.ClaimEffect[Order] = (*HelperLogsKey)(nil)
	_ sdk.ClaimEffect[Order] = (*FieldKey)(nil)
	_ sdk.ClaimEffect[Order] = (*HeaderKey)(nil)
	_ sdk.ClaimEffect[Order] = (*ClosureKey)(nil)
)

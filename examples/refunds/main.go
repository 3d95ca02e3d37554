// Command refunds is an usher plugin written the way a third party would,
// from usher's README and the sdk's godoc alone. It serves two kinds:
//
//	kind           guard                               effect
//	refund         a claim row and the provider's key  a refund at a payment provider
//	credit_wallet  the job id recorded                 a wallet's balance and ledger
//
// The provider's base URL comes from REFUNDS_PROVIDER_URL, which the
// operator passes with host run --plugin-env; REFUNDS_CLAIM_LEASE (a Go
// duration, default the SDK's 2 minutes) is how long a refund's claim holds
// before another run may take it over.
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/usherhq/usher/sdk"
)

// version is set at build time: make build VERSION=1.2.0.
var version = "1.0.0"

func main() {
	lease, err := leaseFrom(os.Getenv("REFUNDS_CLAIM_LEASE"))
	if err != nil {
		// stderr: stdout belongs to go-plugin's handshake.
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sdk.Serve(newPlugin(os.Getenv("REFUNDS_PROVIDER_URL"), lease))
}

// newPlugin registers each kind through its guard; the tests build the
// plugin the same way, with their own provider.
func newPlugin(providerURL string, lease time.Duration) *sdk.Plugin {
	p := sdk.New("refunds", version)
	sdk.HandleClaim(p, refund{provider: providerURL, client: &http.Client{Timeout: providerTimeout}, lease: lease})
	sdk.HandleRecordJobID(p, creditWallet{})
	sdk.HandleWorkflow(p, "return", decideReturn)
	return p
}

// providerTimeout bounds one call to the provider. A claim's lease must be
// longer: a lease that ends while the call is still out lets another run
// take the claim and call again (the key still makes that call harmless).
const providerTimeout = 10 * time.Second

func leaseFrom(s string) (time.Duration, error) {
	if s == "" {
		return sdk.DefaultLease, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= providerTimeout {
		return 0, fmt.Errorf("REFUNDS_CLAIM_LEASE=%q: want a duration longer than the provider timeout, %s", s, providerTimeout)
	}
	return d, nil
}

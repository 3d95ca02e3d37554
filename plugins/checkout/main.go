// Command checkout is the plugin serving Stagedoor's checkout workflow
// (package flow): reserve the seats, wait for the payment_confirmed signal
// up to the checkout's hold, then render the tickets and count the sale at
// once and send the tickets; on the hold's timeout or a cancel, release the
// seats. Its own kinds, both state first on its seat_holds table:
//
//   - reserve_seats: insert the order's hold where there is none; only
//     the winning run adds the seats to the event's seats_held;
//   - release_seats (the compensation): mark the hold released where it
//     is not yet; only the winning run takes the seats off.
//
// The workflow's other steps are the tickets and counters plugins' kinds,
// which its manifest lists under enqueues.
//
// plugins/checkout/chaos is the same plugin with faults injected from
// outside, for tests, the demo and the chaos suite.
package main

import (
	"github.com/usherhq/usher/plugins/checkout/checkout"
	"github.com/usherhq/usher/sdk"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "1.0.0"

func main() {
	sdk.Serve(checkout.Plugin(version))
}

// Package checkout builds the checkout plugin, for its shipped main
// (plugins/checkout) and its chaos build (plugins/checkout/chaos) alike, so
// the two serve the same handlers and the same workflow.
package checkout

import (
	"github.com/usherhq/usher/plugins/checkout/flow"
	"github.com/usherhq/usher/plugins/checkout/seats"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// Kinds are the kinds the plugin serves; Enqueues the other plugins' kinds
// its workflow schedules as steps, which its manifest must list
// (`host plugins manifest --enqueue`).
var (
	Kinds    = []string{"reserve_seats", "release_seats", "usher.workflow." + stagedoor.CheckoutType}
	Enqueues = []string{"render_tickets", "update_sales_counter", "send_tickets"}
)

// Plugin registers reserve_seats, release_seats and the checkout workflow.
func Plugin(version string) *sdk.Plugin {
	p := sdk.New("checkout", version)
	sdk.HandleStateFirst(p, seats.Reserve{})
	sdk.HandleStateFirst(p, seats.Release{})
	sdk.HandleWorkflow(p, stagedoor.CheckoutType, flow.Decide, sdk.AcceptMigration(flow.Accept))
	return p
}

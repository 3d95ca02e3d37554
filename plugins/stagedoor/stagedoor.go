// Package stagedoor holds the job payloads of the Stagedoor ticketing
// example, shared by the plugins that serve them and the application that
// enqueues them. It imports only the SDK.
package stagedoor

// RenderTickets asks for "order N's tickets are rendered and queued to send".
type RenderTickets struct {
	OrderID int64 `json:"order_id"`
}

// Kind implements sdk.Args.
func (RenderTickets) Kind() string { return "render_tickets" }

// SendTickets asks for "order N's ticket email has been sent".
type SendTickets struct {
	OrderID int64 `json:"order_id"`
}

// Kind implements sdk.Args.
func (SendTickets) Kind() string { return "send_tickets" }

// UpdateSalesCounter asks for "order N's seats are counted in its event's
// sales counter".
type UpdateSalesCounter struct {
	OrderID int64 `json:"order_id"`
}

// Kind implements sdk.Args.
func (UpdateSalesCounter) Kind() string { return "update_sales_counter" }

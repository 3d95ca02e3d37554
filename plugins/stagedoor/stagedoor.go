// Package stagedoor holds the job payloads of the Stagedoor ticketing
// example, shared by the plugins that serve them and the application that
// enqueues them. It imports only the SDK.
package stagedoor

// RenderTickets asks for "order N's tickets are rendered and queued to send".
type RenderTickets struct {
	OrderID int64 `json:"order_id"`
	// SendSeparately: the render queues no send_tickets, because its
	// caller sends them itself (the checkout workflow schedules
	// send_tickets as a step of its own, after the render and the count).
	SendSeparately bool `json:"send_separately,omitempty"`
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
// sales counter". EventID, when set, is the order's event: the counter's
// write then names the row it increments, and batches of several hosts
// lock the events they share in one order (see host/guard, inLockOrder).
// Without it (an enqueue that knows only the order) the write finds the
// event through the order, as it always did.
type UpdateSalesCounter struct {
	OrderID int64 `json:"order_id"`
	EventID int64 `json:"event_id,omitempty"`
}

// Kind implements sdk.Args.
func (UpdateSalesCounter) Kind() string { return "update_sales_counter" }

// ReserveSeats asks for "order N's seats are held for its checkout": one
// seat_holds row, and the order's seats added to its event's seats_held.
type ReserveSeats struct {
	OrderID int64 `json:"order_id"`
}

// Kind implements sdk.Args.
func (ReserveSeats) Kind() string { return "reserve_seats" }

// ReleaseSeats asks for "order N's held seats are given back": its
// seat_holds row marked released, and its seats taken off seats_held. The
// checkout's compensation.
type ReleaseSeats struct {
	OrderID int64 `json:"order_id"`
}

// Kind implements sdk.Args.
func (ReleaseSeats) Kind() string { return "release_seats" }

// The checkout workflow (plugins/checkout): its type, its input, the
// signal that pays it.
const (
	// CheckoutType is the workflow type; a checkout's workflow id is its
	// order's public id.
	CheckoutType = "checkout"
	// PaymentConfirmed is the signal the application sends, from the
	// transaction that records the payment, once the order is paid.
	PaymentConfirmed = "payment_confirmed"
)

// Checkout is a checkout workflow's input.
type Checkout struct {
	OrderID int64 `json:"order_id"`
	// PayWithinMS is how long the seats are held waiting for the payment,
	// in milliseconds, from the workflow's first decision; 0 means
	// DefaultPayWithin.
	PayWithinMS int64 `json:"pay_within_ms,omitempty"`
}

// DefaultPayWithinMS is a checkout's hold when its input names none: 15
// minutes.
const DefaultPayWithinMS = 15 * 60 * 1000

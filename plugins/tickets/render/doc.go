// Package render turns a Stagedoor ticket order into a printable PDF.
//
// [PDF] lays out one A6 page per ticket with the event name, venue, start
// time, seat, buyer, order reference and a QR code that encodes the ticket's
// scannable code. It uses only the PDF core font Helvetica (and Courier for
// the code), so no font files are needed; text is translated to the
// Windows-1252 code page, characters outside it are printed as '?', and
// text too long for its slot is wrapped and then cut with an ellipsis.
//
// Output is deterministic: the same [Order] yields byte-identical PDFs on every
// call and in every process. The document dates come from Order.CreatedAt,
// resources are written in a fixed order and nothing depends on the clock,
// map iteration order or the process environment (other than the location
// carried by Order.StartsAt, which is printed as given). That makes the bytes
// safe to cache, hash or compare.
package render

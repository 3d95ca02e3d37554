package render

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/go-pdf/fpdf"
	qrcode "github.com/skip2/go-qrcode"
)

// Order is what the ticket PDF shows; the handler reads it from the database.
type Order struct {
	// ID is the database id of the order. It is printed only when PublicID
	// is empty.
	ID int64
	// PublicID is the customer-facing order reference, e.g. "SD-4471".
	PublicID string
	// EventName is the title of the event, printed in the page header.
	EventName string
	// Venue is the venue name and, optionally, its address.
	Venue string
	// StartsAt is when the event starts. It is printed in its own location,
	// so callers should pass it in the venue's time zone (time.Local makes
	// the output depend on the process's TZ setting).
	StartsAt time.Time
	// Buyer is the name of the person who bought the tickets.
	Buyer string
	// Email is the buyer's e-mail address.
	Email string
	// CreatedAt is when the order was placed. It becomes the PDF's creation
	// and modification date and must not be zero.
	CreatedAt time.Time
	// Tickets are rendered one per page, in slice order.
	Tickets []Ticket
}

// Ticket is a single admission within an Order.
type Ticket struct {
	// ID is the database id of the ticket.
	ID int64
	// Code is the scannable ticket id that the QR code encodes.
	Code string
	// Seat is the seat label; empty means general admission.
	Seat string
}

// Page geometry, in millimetres (A6 portrait).
const (
	pageW     = 105.0
	margin    = 8.0
	headerH   = 29.0
	qrMaxSize = 52.0 // largest printed size of the QR symbol, quiet zone included
	codeLineH = 4.0  // line height of the plain-text ticket code
	footerY   = 124.0

	// qrModulePx is the number of image pixels per QR module. Modules are
	// always whole pixels so the code stays crisp when scaled.
	qrModulePx = 8
)

// PDF renders o as a PDF with one A6 page per ticket and returns its bytes.
//
// The result is deterministic: the same Order always gives byte-identical
// output. PDF fails if the order has no tickets, if a ticket has an empty
// code or if o.CreatedAt is zero (it is the only date source the document may
// use).
func PDF(o Order) ([]byte, error) {
	ref := o.ref()
	if len(o.Tickets) == 0 {
		return nil, fmt.Errorf("render: order %s has no tickets", ref)
	}
	for _, t := range o.Tickets {
		if strings.TrimSpace(t.Code) == "" {
			return nil, fmt.Errorf("render: order %s: ticket %d has an empty code", ref, t.ID)
		}
	}
	if o.CreatedAt.IsZero() {
		return nil, fmt.Errorf("render: order %s has no creation time", ref)
	}

	qrs, err := qrImages(o.Tickets)
	if err != nil {
		return nil, fmt.Errorf("render: order %s: %w", ref, err)
	}

	pdf := fpdf.New("P", "mm", "A6", "")
	// Pin everything that could otherwise come from package-level defaults
	// (which other code may change) or from the clock.
	pdf.SetCompression(true)
	pdf.SetCatalogSort(true)
	created := o.CreatedAt.UTC()
	pdf.SetCreationDate(created)
	pdf.SetModificationDate(created)
	pdf.SetProducer("Stagedoor", false)
	pdf.SetCreator("Stagedoor", false)
	pdf.SetTitle(strings.TrimSpace(clean(o.EventName)+" - "+ref), true)
	pdf.SetAutoPageBreak(false, 0)
	pdf.SetMargins(margin, margin, margin)
	pdf.SetCellMargin(0)

	tr := pdf.UnicodeTranslatorFromDescriptor("") // cp1252
	for i := range o.Tickets {
		drawTicket(pdf, tr, o, i, qrs[i])
	}

	var buf bytes.Buffer
	if err := pdf.Output(&buf); err != nil {
		return nil, fmt.Errorf("render: order %s: %w", ref, err)
	}
	return buf.Bytes(), nil
}

// ref is how error messages and the page refer to the order.
func (o Order) ref() string {
	if s := clean(o.PublicID); s != "" {
		return s
	}
	return "#" + strconv.FormatInt(o.ID, 10)
}

// qrImage is a QR code PNG registered with the document under name.
type qrImage struct {
	name     string
	png      []byte
	widthPx  int // full image width (and height)
	offsetPx int // left/top offset of the symbol inside the image
	symbolPx int // width of the symbol, quiet zone included
}

// qrImages encodes one QR code per ticket.
//
// fpdf writes image objects sorted by pixel width only, starting from map
// iteration order, so two images of equal width would be emitted in random
// order. To keep the output deterministic every distinct image gets a unique
// width: the symbol is drawn on a white canvas of (largest symbol + index)
// pixels. The extra pixels are invisible quiet-zone padding, and drawTicket
// scales each image so that the symbol itself prints at the intended size.
func qrImages(tickets []Ticket) ([]qrImage, error) {
	bitmaps := make([][][]bool, len(tickets))
	maxPx := 0
	for i, t := range tickets {
		q, err := qrcode.New(t.Code, qrcode.Medium)
		if err != nil {
			return nil, fmt.Errorf("ticket %d: encode QR code: %w", t.ID, err)
		}
		bitmaps[i] = q.Bitmap() // includes the 4-module quiet zone
		maxPx = max(maxPx, len(bitmaps[i])*qrModulePx)
	}

	out := make([]qrImage, len(tickets))
	seen := make(map[string]int, len(tickets)) // code -> index in out
	distinct := 0
	for i, t := range tickets {
		if j, ok := seen[t.Code]; ok {
			// fpdf keeps the first image registered under a name, so a
			// repeated code must reuse that image's geometry too.
			out[i] = out[j]
			continue
		}
		seen[t.Code] = i
		img := qrImage{
			name:     "qr:" + t.Code,
			widthPx:  maxPx + distinct,
			symbolPx: len(bitmaps[i]) * qrModulePx,
		}
		distinct++
		img.offsetPx = (img.widthPx - img.symbolPx) / 2
		data, err := encodeQR(bitmaps[i], img.widthPx, img.offsetPx)
		if err != nil {
			return nil, fmt.Errorf("ticket %d: encode QR PNG: %w", t.ID, err)
		}
		img.png = data
		out[i] = img
	}
	return out, nil
}

// encodeQR draws bitmap (true = dark module) as a two-colour PNG of
// size×size pixels with the symbol's top-left corner at (offset, offset).
func encodeQR(bitmap [][]bool, size, offset int) ([]byte, error) {
	pal := color.Palette{color.Gray{Y: 0xff}, color.Gray{Y: 0x00}}
	img := image.NewPaletted(image.Rect(0, 0, size, size), pal) // all white
	for my, row := range bitmap {
		for mx, dark := range row {
			if !dark {
				continue
			}
			x0, y0 := offset+mx*qrModulePx, offset+my*qrModulePx
			for y := y0; y < y0+qrModulePx; y++ {
				for x := x0; x < x0+qrModulePx; x++ {
					img.Pix[img.PixOffset(x, y)] = 1
				}
			}
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// drawTicket adds the page for ticket idx of o.
func drawTicket(pdf *fpdf.Fpdf, tr func(string) string, o Order, idx int, qr qrImage) {
	t := o.Tickets[idx]
	contentW := pageW - 2*margin
	text := latin1(tr)

	pdf.AddPage()

	// Header band: brand line, ticket counter and the event name.
	pdf.SetFillColor(28, 30, 48)
	pdf.Rect(0, 0, pageW, headerH, "F")
	pdf.SetFont("Helvetica", "B", 7)
	pdf.SetTextColor(255, 196, 0)
	pdf.SetXY(margin, 5)
	pdf.CellFormat(contentW, 3.5, "STAGEDOOR  "+tr("·")+"  ADMIT ONE", "", 0, "L", false, 0, "")
	pdf.SetTextColor(200, 202, 215)
	pdf.SetXY(margin, 5)
	pdf.CellFormat(contentW, 3.5, fmt.Sprintf("TICKET %d OF %d", idx+1, len(o.Tickets)), "", 0, "R", false, 0, "")

	pdf.SetFont("Helvetica", "B", 15)
	pdf.SetTextColor(255, 255, 255)
	const titleLineH = 6.5
	title := wrap(pdf, text(o.EventName), contentW, 2)
	y := 11 + (headerH-11-float64(len(title))*titleLineH)/2
	for _, line := range title {
		pdf.SetXY(margin, y)
		pdf.CellFormat(contentW, titleLineH, line, "", 0, "L", false, 0, "")
		y += titleLineH
	}

	// Details.
	y = headerH + 3.5
	y = field(pdf, "VENUE", text(o.Venue), "", 10, 2, y)
	y = field(pdf, "DATE", tr(startsAt(o.StartsAt)), "", 10, 1, y)
	seat := text(t.Seat)
	if seat == "" {
		seat = "General admission"
	}
	detailsEnd := field(pdf, "SEAT", seat, "B", 13, 1, y) - 2

	// The code in plain text, for manual entry at the door, sits just above
	// the footer; the QR code is centred in the space left between it and
	// the details, up to qrMaxSize.
	pdf.SetFont("Courier", "", 9)
	pdf.SetTextColor(40, 40, 40)
	code := wrap(pdf, text(t.Code), contentW, 2)
	y = footerY - 3 - float64(len(code))*codeLineH
	for _, line := range code {
		pdf.SetXY(margin, y)
		pdf.CellFormat(contentW, codeLineH, line, "", 0, "C", false, 0, "")
		y += codeLineH
	}
	space := footerY - 3 - float64(len(code))*codeLineH - detailsEnd
	qrSize := min(qrMaxSize, space)
	qrTop := detailsEnd + (space-qrSize)/2
	scale := qrSize / float64(qr.symbolPx) // mm per image pixel
	pdf.RegisterImageOptionsReader(qr.name, fpdf.ImageOptions{ImageType: "png"}, bytes.NewReader(qr.png))
	pdf.ImageOptions(qr.name,
		(pageW-qrSize)/2-float64(qr.offsetPx)*scale, qrTop-float64(qr.offsetPx)*scale,
		float64(qr.widthPx)*scale, float64(qr.widthPx)*scale,
		false, fpdf.ImageOptions{ImageType: "png"}, 0, "")

	// Footer: a perforation line, then buyer and order reference.
	pdf.SetDrawColor(150, 150, 150)
	pdf.SetLineWidth(0.2)
	pdf.SetDashPattern([]float64{1.2, 1.2}, 0)
	pdf.Line(margin, footerY, pageW-margin, footerY)
	pdf.SetDashPattern([]float64{}, 0)

	const orderW = 28.0
	buyerW := contentW - orderW - 4
	fy := field(pdf, "BUYER", text(o.Buyer), "B", 10, 1, footerY+3, buyerW)
	if email := text(o.Email); email != "" {
		pdf.SetFont("Helvetica", "", 8)
		pdf.SetTextColor(90, 90, 90)
		for _, line := range wrap(pdf, email, buyerW, 1) {
			pdf.SetXY(margin, fy-1)
			pdf.CellFormat(buyerW, 3.5, line, "", 0, "L", false, 0, "")
		}
	}
	labelAt(pdf, "ORDER", pageW-margin-orderW, footerY+3, orderW, "R")
	pdf.SetFont("Helvetica", "B", 10)
	pdf.SetTextColor(20, 20, 20)
	pdf.SetXY(pageW-margin-orderW, footerY+6)
	pdf.CellFormat(orderW, 4.5, firstLine(wrap(pdf, text(o.ref()), orderW, 1)), "", 0, "R", false, 0, "")
}

// field draws a small grey label with a value below it at the left margin
// and returns the y coordinate below the block. The value is wrapped to at
// most maxLines lines of width w (default: the content width).
func field(pdf *fpdf.Fpdf, label, value, style string, size float64, maxLines int, y float64, w ...float64) float64 {
	width := pageW - 2*margin
	if len(w) > 0 {
		width = w[0]
	}
	labelAt(pdf, label, margin, y, width, "L")
	y += 3
	pdf.SetFont("Helvetica", style, size)
	pdf.SetTextColor(20, 20, 20)
	lineH := size * 0.45
	for _, line := range wrap(pdf, value, width, maxLines) {
		pdf.SetXY(margin, y)
		pdf.CellFormat(width, lineH, line, "", 0, "L", false, 0, "")
		y += lineH
	}
	return y + 2.5
}

// labelAt draws a field label.
func labelAt(pdf *fpdf.Fpdf, label string, x, y, w float64, align string) {
	pdf.SetFont("Helvetica", "B", 6.5)
	pdf.SetTextColor(120, 120, 130)
	pdf.SetXY(x, y)
	pdf.CellFormat(w, 3, label, "", 0, align, false, 0, "")
}

// startsAt formats the event start in its own location.
func startsAt(t time.Time) string {
	if t.IsZero() {
		return "To be announced"
	}
	return t.Format("Mon 2 Jan 2006  ·  15:04 MST")
}

// clean replaces control characters with spaces and collapses runs of white
// space, so user-supplied text cannot break the single-line layout.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

// latin1 returns a function that prepares user text for the core fonts:
// it cleans s, drops combining marks and invisible format characters (such
// as emoji variation selectors) and translates the rest to cp1252 with tr,
// printing '?' for characters the code page lacks.
func latin1(tr func(string) string) func(string) string {
	return func(s string) string {
		var b strings.Builder
		for _, r := range clean(s) {
			switch {
			case unicode.In(r, unicode.Mn, unicode.Cf):
				// Dropped.
			case r < 0x80:
				b.WriteRune(r)
			default:
				if c := tr(string(r)); c != "." {
					b.WriteString(c)
				} else { // tr's marker for "not in the code page"
					b.WriteByte('?')
				}
			}
		}
		return b.String()
	}
}

// wrap breaks s (already in the PDF's single-byte encoding, words separated
// by single spaces) into lines no wider than w in the current font. If more
// than maxLines lines are needed the last one is cut short with an ellipsis.
// Words wider than w are broken between bytes.
func wrap(pdf *fpdf.Fpdf, s string, w float64, maxLines int) []string {
	fits := func(s string) bool { return pdf.GetStringWidth(s) <= w }
	var lines []string
	cur := ""
	for _, word := range strings.Split(s, " ") {
		if word == "" {
			continue
		}
		if cand := strings.TrimPrefix(cur+" "+word, " "); fits(cand) {
			cur = cand
			continue
		}
		if cur != "" {
			lines = append(lines, cur)
		}
		for !fits(word) && len(word) > 1 {
			n := len(word) - 1
			for n > 1 && !fits(word[:n]) {
				n--
			}
			lines = append(lines, word[:n])
			word = word[n:]
		}
		cur = word
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	if len(lines) > maxLines {
		const ellipsis = "\x85" // "…" in cp1252
		last := lines[maxLines-1]
		for last != "" && !fits(last+ellipsis) {
			last = last[:len(last)-1]
		}
		lines = append(lines[:maxLines-1], strings.TrimRight(last, " ")+ellipsis)
	}
	return lines
}

// firstLine returns the first element of lines, or "".
func firstLine(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return lines[0]
}

package render_test

import (
	"bytes"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/plugins/tickets/render"
)

// samplePath is where TestPDFSample leaves a PDF for humans to look at.
const samplePath = "/tmp/ticket-sample.pdf"

func sampleOrder() render.Order {
	cet := time.FixedZone("CET", 3600)
	return render.Order{
		ID:        4471,
		PublicID:  "SD-4471",
		EventName: "Nils Frahm — Live at the Funkhaus",
		Venue:     "Funkhaus Berlin, Nalepastraße 18, 12459 Berlin",
		StartsAt:  time.Date(2026, time.March, 14, 19, 30, 0, 0, cet),
		Buyer:     "Zoë Müller",
		Email:     "zoe.mueller@example.com",
		CreatedAt: time.Date(2026, time.January, 5, 10, 11, 12, 0, time.UTC),
		Tickets: []render.Ticket{
			{ID: 9001, Code: "SDT-7Q4M-XK2P-9001", Seat: "Stalls, Row F, Seat 12"},
			{ID: 9002, Code: "SDT-7Q4M-XK2P-9002", Seat: "Stalls, Row F, Seat 13"},
			{ID: 9003, Code: "SDT-7Q4M-XK2P-9003", Seat: ""},
		},
	}
}

var pageRE = regexp.MustCompile(`/Type\s*/Page\b`) // \b excludes /Pages

func pageCount(pdf []byte) int { return len(pageRE.FindAll(pdf, -1)) }

func mustPDF(t *testing.T, o render.Order) []byte {
	t.Helper()
	b, err := render.PDF(o)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(b, []byte("%PDF-")), "output does not start with %%PDF-")
	return b
}

func TestPDFOnePagePerTicket(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 7} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			o := sampleOrder()
			o.Tickets = nil
			for i := range n {
				o.Tickets = append(o.Tickets, render.Ticket{
					ID: int64(100 + i), Code: fmt.Sprintf("CODE-%03d", i), Seat: fmt.Sprintf("A%d", i),
				})
			}
			b := mustPDF(t, o)
			require.Equal(t, n, pageCount(b))
			require.True(t, bytes.HasSuffix(bytes.TrimSpace(b), []byte("%%EOF")))
		})
	}
}

func TestPDFDeterministic(t *testing.T) {
	t.Parallel()
	o := sampleOrder()
	first := mustPDF(t, o)
	// Repeat enough times that any dependence on map iteration order
	// (which Go randomises on every range) would show up.
	for i := range 50 {
		require.True(t, bytes.Equal(first, mustPDF(t, o)), "render %d differs from the first", i)
	}

	// The same instant in another location is the same order.
	o.CreatedAt = o.CreatedAt.In(time.FixedZone("X", -7*3600))
	require.True(t, bytes.Equal(first, mustPDF(t, o)), "CreatedAt location changed the output")
}

// TestPDFDeterministicAcrossProcesses re-runs the test binary in child
// processes with different TZ settings and compares their output.
func TestPDFDeterministicAcrossProcesses(t *testing.T) {
	if out := os.Getenv("RENDER_TEST_OUT"); out != "" {
		b, err := render.PDF(sampleOrder())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(out, b, 0o600))
		return
	}
	t.Parallel()
	want := mustPDF(t, sampleOrder())
	for i, tz := range []string{"UTC", "Asia/Kolkata", "America/Los_Angeles"} {
		out := filepath.Join(t.TempDir(), fmt.Sprintf("child-%d.pdf", i))
		cmd := exec.Command(os.Args[0], "-test.run=^TestPDFDeterministicAcrossProcesses$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RENDER_TEST_OUT="+out, "TZ="+tz)
		msg, err := cmd.CombinedOutput()
		require.NoError(t, err, "child process (TZ=%s): %s", tz, msg)
		got, err := os.ReadFile(out)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "child process with TZ=%s produced different bytes", tz)
	}
}

func TestPDFDifferentOrdersDiffer(t *testing.T) {
	t.Parallel()
	base := mustPDF(t, sampleOrder())
	changes := map[string]func(*render.Order){
		"code":       func(o *render.Order) { o.Tickets[0].Code += "X" },
		"seat":       func(o *render.Order) { o.Tickets[1].Seat = "Balcony 1" },
		"buyer":      func(o *render.Order) { o.Buyer = "Someone Else" },
		"public id":  func(o *render.Order) { o.PublicID = "SD-4472" },
		"starts at":  func(o *render.Order) { o.StartsAt = o.StartsAt.Add(time.Hour) },
		"created at": func(o *render.Order) { o.CreatedAt = o.CreatedAt.Add(time.Second) },
		"tickets":    func(o *render.Order) { o.Tickets = o.Tickets[:2] },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := sampleOrder()
			change(&o)
			require.False(t, bytes.Equal(base, mustPDF(t, o)))
		})
	}
}

func TestPDFErrors(t *testing.T) {
	t.Parallel()

	o := sampleOrder()
	o.Tickets = nil
	_, err := render.PDF(o)
	require.EqualError(t, err, "render: order SD-4471 has no tickets")

	o = sampleOrder()
	o.Tickets[1].Code = ""
	_, err = render.PDF(o)
	require.ErrorContains(t, err, "ticket 9002")
	require.ErrorContains(t, err, "SD-4471")

	o = sampleOrder()
	o.Tickets[2].Code = "   "
	_, err = render.PDF(o)
	require.ErrorContains(t, err, "ticket 9003")

	o = sampleOrder()
	o.CreatedAt = time.Time{}
	_, err = render.PDF(o)
	require.ErrorContains(t, err, "creation time")

	o = sampleOrder()
	o.PublicID = ""
	o.Tickets = nil
	_, err = render.PDF(o)
	require.EqualError(t, err, "render: order #4471 has no tickets")
}

// TestPDFAwkwardInput checks that text the layout was not designed for still
// renders: overlong names, characters outside Latin-1, control characters,
// duplicate codes and a zero start time.
func TestPDFAwkwardInput(t *testing.T) {
	t.Parallel()
	o := sampleOrder()
	o.EventName = strings.Repeat("An Extraordinarily Long Event Title ", 8)
	o.Venue = strings.Repeat("Venuenamewithoutanyspacesatall", 5)
	o.Buyer = "李小龍 🎟️\n\tDROP TABLE"
	o.Email = strings.Repeat("x", 120) + "@example.com"
	o.StartsAt = time.Time{}
	o.Tickets = []render.Ticket{
		{ID: 1, Code: strings.Repeat("LONGCODE", 30), Seat: strings.Repeat("Seat ", 40)},
		{ID: 2, Code: "DUP"},
		{ID: 3, Code: "DUP"},
	}
	a := mustPDF(t, o)
	require.Equal(t, 3, pageCount(a))
	require.True(t, bytes.Equal(a, mustPDF(t, o)))
}

// TestPDFSample writes samplePath for manual inspection and, when pdftoppm
// is installed, checks that poppler can rasterise the first page.
func TestPDFSample(t *testing.T) {
	t.Parallel()
	b := mustPDF(t, sampleOrder())
	require.NoError(t, os.WriteFile(samplePath, b, 0o644))

	pdftoppm, err := exec.LookPath("pdftoppm")
	if err != nil {
		t.Log("pdftoppm not on PATH; skipping the rasterisation check")
		return
	}
	in := filepath.Join(t.TempDir(), "ticket.pdf")
	require.NoError(t, os.WriteFile(in, b, 0o600))
	outBase := filepath.Join(t.TempDir(), "page1")
	msg, err := exec.Command(pdftoppm, "-png", "-r", "100", "-f", "1", "-l", "1", "-singlefile", in, outBase).CombinedOutput()
	require.NoError(t, err, "pdftoppm: %s", msg)

	raw, err := os.ReadFile(outBase + ".png")
	require.NoError(t, err)
	require.NotEmpty(t, raw)
	img, err := png.Decode(bytes.NewReader(raw))
	require.NoError(t, err)
	// A6 at 100 dpi is about 413×583 pixels.
	require.InDelta(t, 413, img.Bounds().Dx(), 3)
	require.InDelta(t, 583, img.Bounds().Dy(), 3)

	// If zbar is installed too, check that the QR code actually scans.
	zbarimg, err := exec.LookPath("zbarimg")
	if err != nil {
		t.Log("zbarimg not on PATH; skipping the QR decode check")
		return
	}
	msg, err = exec.Command(zbarimg, "-q", "--raw", outBase+".png").Output()
	require.NoError(t, err, "zbarimg")
	require.Equal(t, sampleOrder().Tickets[0].Code, strings.TrimSpace(string(msg)))
}

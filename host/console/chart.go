package console

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
	"time"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH         = 640, 200
	padL, padR, padT, padB = 56, 110, 24, 28
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
)

// lineColors are the series' colours, in order (colour-blind safe).
var lineColors = []string{"#1b7837", "#2166ac", "#b2182b", "#762a83", "#e08214", "#4d4d4d"}

// drawChart draws lines (values over time, from t0 to t1) as an SVG line
// chart with a title, a y axis from 0 to the largest value labelled by
// unit, a time axis and a legend; a line of one point is a dot. Every text
// it writes is escaped: it is inserted into the page as HTML.
func drawChart(title string, unit func(float64) string, t0, t1 time.Time, lines []series) string {
	maxY := 0.0
	points := 0
	for _, l := range lines {
		for _, p := range l.Points {
			maxY = math.Max(maxY, p.Value)
			points++
		}
	}
	if maxY == 0 {
		maxY = 1
	}
	maxY = niceCeil(maxY)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" role="img" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg"><title>%s</title>`,
		chartW, chartH, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="14" class="chart-title">%s</text>`, padL, html.EscapeString(title))
	// Axes and y gridlines at 0, half and max.
	for _, f := range []float64{0, 0.5, 1} {
		y := padT + plotH - f*plotH
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" class="grid"/>`, padL, y, padL+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>`, padL-6, y+4, html.EscapeString(unit(f*maxY)))
	}
	if t1.After(t0) {
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="tick">%s</text>`, padL, chartH-8, t0.UTC().Format("15:04:05"))
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="tick" text-anchor="end">%s UTC</text>`, padL+plotW, chartH-8, t1.UTC().Format("15:04:05"))
	}
	if points == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="tick">none in this window</text>`, padL+plotW/2, padT+plotH/2)
	}
	span := t1.Sub(t0).Seconds()
	for i, l := range lines {
		color := lineColors[i%len(lineColors)]
		var pts, values []string
		for _, p := range l.Points {
			values = append(values, strconv.FormatFloat(p.Value, 'g', -1, 64))
			x := float64(padL)
			if span > 0 {
				x += p.At.Sub(t0).Seconds() / span * plotW
			}
			y := padT + plotH - p.Value/maxY*plotH
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		if len(pts) == 1 {
			x, y, _ := strings.Cut(pts[0], ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, x, y, color)
			pts = append(pts, pts[0])
		}
		if len(pts) > 0 {
			// data-values: the values drawn, for a reader (or a test)
			// that wants the numbers.
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s" data-series="%s" data-values="%s"/>`,
				color, strings.Join(pts, " "), html.EscapeString(l.Name), strings.Join(values, " "))
		}
		ly := padT + 14*i + 6
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/>`, padL+plotW+10, ly-9, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="legend">%s</text>`, padL+plotW+24, ly, html.EscapeString(l.Name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func perSecond(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 3, 64) + "/s"
}

func millis(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 3, 64) + " ms"
}

func eventCount(v float64) string {
	return strconv.FormatFloat(v, 'g', 3, 64)
}

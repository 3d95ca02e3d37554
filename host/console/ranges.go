package console

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// rangeBuckets is about how many buckets a chosen range is drawn in: its
// bucket is the range over this, so a week's chart has as many points as
// an hour's.
const rangeBuckets = 60

// chartRanges are the ranges the overview offers besides the configured
// window (Config.ChartWindow), shortest first.
var chartRanges = []time.Duration{time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}

// chartRange is one range the overview's charts can cover.
type chartRange struct {
	// Label is how ?range= names it: "1h", "24h", "7d".
	Label  string
	Window time.Duration
	Bucket time.Duration
}

// ranges are the choices: the configured window with its own bucket, then
// chartRanges (the configured window once), shortest first.
func (c *Console) ranges() []chartRange {
	out := []chartRange{{Label: rangeLabel(c.cfg.ChartWindow), Window: c.cfg.ChartWindow, Bucket: c.cfg.ChartBucket}}
	for _, w := range chartRanges {
		if w == c.cfg.ChartWindow {
			continue
		}
		out = append(out, chartRange{Label: rangeLabel(w), Window: w, Bucket: w / rangeBuckets})
	}
	for i := 1; i < len(out); i++ { // insertion sort: a handful
		for j := i; j > 0 && out[j].Window < out[j-1].Window; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// chosenRange is the range ?range= names; "" is the configured window.
// Anything else is an error that lists the choices.
func (c *Console) chosenRange(v string) (chartRange, error) {
	all := c.ranges()
	if v == "" {
		v = rangeLabel(c.cfg.ChartWindow)
	}
	labels := make([]string, len(all))
	for i, r := range all {
		if r.Label == v {
			return r, nil
		}
		labels[i] = r.Label
	}
	return chartRange{}, fmt.Errorf("range=%q is not a range the overview charts: one of %s", v, strings.Join(labels, ", "))
}

// liveSeconds is how often the overview of a range refreshes itself: every
// 2 s for an hour, less often for longer ranges (a week every few
// minutes), since each refresh reads the range's history again and a
// bucket of a long range changes slowly.
func liveSeconds(window time.Duration) int {
	return max(2, int(window/(30*time.Minute)))
}

// rangeLabel names a window the way ?range= takes it: whole days above a
// day ("7d"), else whole hours ("24h"), minutes or seconds, else Go's
// duration text.
func rangeLabel(d time.Duration) string {
	switch {
	case d > 24*time.Hour && d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d >= time.Hour && d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d >= time.Minute && d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d >= time.Second && d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

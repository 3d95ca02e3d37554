package ops

import (
	"fmt"
	"time"
)

// HumanDuration prints d the way a person reads it: 0s, 850µs, 340ms,
// 2.4s, 3m12s, 5h03m, 2d4h. The console and the CLI print durations and
// ages with it.
func HumanDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d < 0:
		return "-" + HumanDuration(-d)
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// Attempt is how the console and the CLI name a job's attempt: its number
// as the outbox, the stream entry and the job history count it (0 for the
// first run, one more per retry or requeue), with its ordinal, "0 (1st)".
// A dead letter's attempt is its job's last (deadletter.Letter.Attempt).
func Attempt(n int) string {
	suffix := "th"
	switch k := (n + 1) % 100; {
	case k%10 == 1 && k != 11:
		suffix = "st"
	case k%10 == 2 && k != 12:
		suffix = "nd"
	case k%10 == 3 && k != 13:
		suffix = "rd"
	}
	return fmt.Sprintf("%d (%d%s)", n, n+1, suffix)
}

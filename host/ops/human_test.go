package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/ops"
)

// An attempt reads as its number, counted from 0 as the history counts
// it, and its ordinal; a duration as a person reads it.
func TestHumanWords(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "0 (1st)", 1: "1 (2nd)", 2: "2 (3rd)", 3: "3 (4th)", 10: "10 (11th)", 11: "11 (12th)",
		12: "12 (13th)", 20: "20 (21st)", 110: "110 (111th)", 120: "120 (121st)"} {
		require.Equal(t, want, ops.Attempt(n), n)
	}
	for d, want := range map[time.Duration]string{0: "0s", 850 * time.Microsecond: "850µs", 340 * time.Millisecond: "340ms",
		2400 * time.Millisecond: "2.4s", 3*time.Minute + 12*time.Second: "3m12s", 5*time.Hour + 3*time.Minute: "5h03m",
		52 * time.Hour: "2d4h", -90 * time.Second: "-1m30s", 90*time.Minute + 20*time.Second: "1h30m"} {
		require.Equal(t, want, ops.HumanDuration(d), d.String())
	}
}

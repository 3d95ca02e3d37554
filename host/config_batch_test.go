package host

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A negative --batch-max is an error, never a silent default; 0 is the
// default (32). --batch-wait defaults to 2ms; negative turns the wait off.
func TestBatchMaxIsChecked(t *testing.T) {
	c := Config{DatabaseURL: "postgres://x", RedisURL: "redis://x", BatchMax: -1}
	require.ErrorContains(t, c.setDefaults(), "BatchMax -1 is negative")
	c = Config{DatabaseURL: "postgres://x", RedisURL: "redis://x"}
	require.NoError(t, c.setDefaults())
	require.Equal(t, 128, c.BatchMax)
	require.Equal(t, 2*time.Millisecond, c.BatchWait, "--batch-wait's default")
	c = Config{DatabaseURL: "postgres://x", RedisURL: "redis://x", BatchWait: -1}
	require.NoError(t, c.setDefaults())
	require.Equal(t, time.Duration(-1), c.BatchWait, "negative: no wait, kept as asked")
}

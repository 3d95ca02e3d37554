package host

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A negative --batch-max is an error, never a silent default; 0 is the
// default (32).
func TestBatchMaxIsChecked(t *testing.T) {
	c := Config{DatabaseURL: "postgres://x", RedisURL: "redis://x", BatchMax: -1}
	require.ErrorContains(t, c.setDefaults(), "BatchMax -1 is negative")
	c = Config{DatabaseURL: "postgres://x", RedisURL: "redis://x"}
	require.NoError(t, c.setDefaults())
	require.Equal(t, 32, c.BatchMax)
}

package route_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/internal/route"
)

// Parked counts every parked delivery; ParkedNow the entries waiting: an
// entry parked again counts once, one run or settled here not at all,
// and one not parked again for ParkedFor (another host took it) drops
// out.
func TestParkedNow(t *testing.T) {
	t.Parallel()
	c := &route.Counters{ParkedFor: time.Minute}
	at := time.Unix(1000, 0)
	c.Unpark("s", "1-0") // nothing parked: nothing to do
	c.Park("s", "1-0", at)
	c.Park("s", "2-0", at)
	c.Park("s", "1-0", at.Add(50*time.Second)) // read again while it waits
	require.EqualValues(t, 3, c.Parked.Load())
	require.EqualValues(t, 2, c.ParkedNow(at.Add(50*time.Second)))
	c.Unpark("s", "2-0") // it ran
	require.EqualValues(t, 1, c.ParkedNow(at.Add(50*time.Second)))
	require.EqualValues(t, 1, c.ParkedNow(at.Add(110*time.Second)), "parked again 60s ago")
	require.EqualValues(t, 0, c.ParkedNow(at.Add(111*time.Second)), "not seen for longer: run elsewhere")
	require.EqualValues(t, 3, c.Parked.Load(), "the total never shrinks")
}

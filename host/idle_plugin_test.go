package host_test

import (
	"testing"
	"time"

	"github.com/usherhq/usher/host/hosttest"
)

// A plugin whose first job arrives more than 5 s after it started must still
// reach the host's callback service: go-plugin's broker drops connection
// info nobody picked up within 5 s, and the SDK dials on its first Invoke.
func TestFirstJobLongAfterPluginStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hosttest.Start(t, b.config())
	time.Sleep(7 * time.Second) // the idle time is the point of the test
	want := b.placeOrders(t, 3, 1)
	b.waitDrained(t, 3)
	b.requireCounters(t, want)
}

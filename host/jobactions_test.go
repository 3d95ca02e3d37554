package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// A cancel through the admin API of a job whose run has started (its
// entry is on the stream) is refused with why, and the run finishes under
// its guard, applied once;
// the job actions want the token, refuse bad input with 422 and a clear
// error, and record who acted.
func TestJobActionsAdminAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	want := b.placeOrders(t, 1, 1)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "2s", Once: true})
	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	call := func(path string, token bool) (int, string) {
		t.Helper()
		c := adminCall{method: "POST", path: path}
		if token {
			c.token = h.AdminToken
		}
		code, _, body := c.do(t, h.AdminAddr())
		return code, body
	}

	for _, path := range []string{"/jobs/cancel?id=" + jobID, "/jobs/run-now?id=1", "/deadletters/discard?id=1", "/deadletters/requeue?id=1"} {
		code, body := call(path, false)
		require.Equal(t, 401, code, "%s: %s", path, body)
	}
	b.held(t, "counter.before_apply", jobID)
	code, body := call("/jobs/cancel?id="+jobID+"&by=ops", true)
	require.Equal(t, 422, code, body)
	require.Contains(t, body, "job "+jobID+" is on the stream")
	require.Contains(t, body, "finishes under its guard")
	b.waitDrained(t, 1)
	b.requireCounters(t, want)
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome = 'applied'`))

	later, err := schedule.NewJob(ctx, b.pool, "update_sales_counter", json.RawMessage(`{"order_id":1}`), time.Now().Add(time.Hour), "", "")
	require.NoError(t, err)
	_, err = deadletter.Add(ctx, b.pool, deadletter.Letter{JobID: "dl", Kind: "update_sales_counter", Payload: []byte(`{}`),
		Reason: "permanent", Attempts: 1, StreamID: "9-0"})
	require.NoError(t, err)
	letter := hosttest.Count(t, b.pool, `SELECT id FROM dead_letters WHERE job_id = 'dl'`)
	for _, tc := range []struct {
		path, want string
		code       int
	}{
		{"/jobs/cancel", "name the job", 422},
		{"/jobs/cancel?id=" + jobID, "has ended (applied)", 422},
		{"/jobs/run-now?id=" + jobID, "has no scheduled run waiting", 422},
		{"/deadletters/requeue?id=x", `\"x\" is not a dead letter ID`, 422},
		{"/deadletters/requeue", "name at least one dead letter", 422},
		{fmt.Sprintf("/deadletters/discard?id=%d&id=99", letter), "discard takes one dead letter", 422},
		{"/deadletters/discard?id=99", "no dead letter 99", 422},
		{"/jobs/run-now?id=" + later + "&by=ops", "job " + later + " is due now", 200},
		{fmt.Sprintf("/deadletters/discard?id=%d&by=ops&reason=spam", letter), "discarded dead letter", 200},
	} {
		code, body := call(tc.path, true)
		require.Equal(t, tc.code, code, "%s: %s", tc.path, body)
		require.Contains(t, body, tc.want, tc.path)
	}
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions WHERE actor LIKE 'ops via the admin API from 127.0.0.1:%'`),
		"the run-now and the discard; no refusal recorded")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND run_at <= now()`, later))
}

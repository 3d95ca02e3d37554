package console_test

import (
	"context"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/retention"
)

// After outbox retention the console reads the same, from the history:
// the jobs search finds a request's jobs by kind, state, time range and
// last error with the same states, attempts and totals, and the request's
// workflow view draws the same tree with the same states and attempts.
// Before retention kept what a job's rows said (job_links), the search
// found a trimmed job only by its id, and an abandoned last delivery read
// "unknown".
func TestConsoleAfterOutboxRetention(t *testing.T) {
	t.Parallel()
	b := setupCurrent(t)
	ctx := context.Background()
	old := time.Now().Add(-3 * time.Hour).UTC().Truncate(time.Second)
	const req = "req-retained"
	row := func(kind string, jobID, parent any, attempt int, created time.Time) int64 {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO outbox (kind, payload, request_id, job_id, parent_job_id, attempt, created_at, done_at, published_at, outcome)
			VALUES ($1, '{}', $2, $3, $4, $5, $6, $6, $6, 'applied') RETURNING id`, kind, req, jobID, parent, attempt, created).Scan(&id))
		return id
	}
	write := func(job, kind string, outboxID int64, attempt int, v outcome.Outcome, errText string) {
		require.NoError(t, history.Write(ctx, b.pool, history.Record{JobID: job, Kind: kind, OutboxID: outboxID, RequestID: req,
			Attempt: attempt, Deliveries: 1, Verdict: v, Error: errText, StartedAt: old}))
	}
	render := row("ret_render", nil, nil, 0, old)
	renderID := strconv.FormatInt(render, 10)
	write(renderID, "ret_render", render, 0, history.Applied, "")
	send := row("ret_send", nil, renderID, 0, old.Add(time.Minute))
	sendID := strconv.FormatInt(send, 10)
	write(sendID, "ret_send", send, 0, history.Retry, "smtp: Connection TIMED OUT")
	retried := row("ret_send", sendID, renderID, 1, old.Add(2*time.Minute))
	write(sendID, "ret_send", retried, 1, history.Applied, "")
	count := row("ret_count", nil, renderID, 0, old.Add(3*time.Minute))
	countID := strconv.FormatInt(count, 10)
	write(countID, "ret_count", count, 0, history.Applied, "")
	write(countID, "ret_count", count, 0, history.Abandoned, "plugin exited") // a slow original, abandoned after

	listRe := regexp.MustCompile(`(?s)<tr data-job="(\d+)">.*?<td class="state">([^<]*)</td><td class="n attempts">(\d+)</td>`)
	shownRe := regexp.MustCompile(`<span id="jobs-shown">([^<]*)</span> of <span id="jobs-total">([^<]*)</span>`)
	treeRe := regexp.MustCompile(`(?s)<ul class="tree">.*</ul>\s*</section>`)
	searches := []url.Values{
		{"request": {req}},
		{"kind": {"ret_send"}},
		{"state": {"done"}, "request": {req}},
		{"from": {old.Add(30 * time.Second).Format(time.RFC3339)}, "to": {old.Add(150 * time.Second).Format(time.RFC3339)}},
		{"error": {"connection timed out"}},
		{"id": {countID}},
	}
	read := func() (lists [][]string, tree string) {
		t.Helper()
		for _, q := range searches {
			page := b.page(t, "/console/jobs?"+q.Encode())
			var l []string
			for _, m := range listRe.FindAllStringSubmatch(page, -1) {
				l = append(l, m[1]+" "+m[2]+" "+m[3])
			}
			m := shownRe.FindStringSubmatch(page)
			require.NotNil(t, m, "no paging line for %v", q)
			lists = append(lists, append(l, m[1]+" of "+m[2]))
		}
		page := b.page(t, "/console/jobs?"+url.Values{"request": {req}}.Encode())
		tree = treeRe.FindString(page)
		require.NotEmpty(t, tree, "no workflow tree")
		return lists, tree
	}
	listsBefore, treeBefore := read()
	require.Equal(t, []string{countID + " done 1", sendID + " done 2", renderID + " done 1", "1–3 of 3"}, listsBefore[0])
	require.Equal(t, []string{sendID + " done 2", "1–1 of 1"}, listsBefore[1])
	require.Equal(t, []string{sendID + " done 2", "1–1 of 1"}, listsBefore[3], "created (its latest run's commit) in range")
	require.Equal(t, []string{sendID + " done 2", "1–1 of 1"}, listsBefore[4], "its last error")

	rdb, stream := hosttest.Redis(t)
	r, err := retention.New(retention.Config{Redis: rdb, Pool: b.pool, Streams: []string{stream}, Group: "usher", Self: "self",
		Logger: hosttest.Logger(t, -4), Redelivery: retention.Redelivery{ReconcileAfter: time.Hour}, Outbox: time.Hour, Margin: time.Minute})
	require.NoError(t, err)
	_, err = r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE request_id = $1`, req), "the rows are gone")

	listsAfter, treeAfter := read()
	require.Equal(t, listsBefore, listsAfter, "the searches find the same jobs, states and attempts")
	require.Equal(t, treeBefore, treeAfter, "the workflow tree is drawn the same")
	// The tree: the send and the count under the render, each with its
	// state and attempts.
	require.Regexp(t, `(?s)<li data-job="`+renderID+`">.*?<span class="state">done</span>.*?<ul>.*<li data-job="`+sendID+
		`">.*?<span class="state">done</span>, 2 attempts`, treeAfter)
	require.Regexp(t, `(?s)<li data-job="`+renderID+`">.*?<ul>.*<li data-job="`+countID+`">.*?<span class="state">done</span>`, treeAfter)
}

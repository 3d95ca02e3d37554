package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// currentBundle is a real host with the counters plugin and its admin
// listener, read over HTTP with the admin token (the console takes it as a
// bearer token, as the API does).
type currentBundle struct {
	pool   *pgxpool.Pool
	rdb    *redis.Client
	stream string
	base   string
	token  string
}

func setupCurrent(t *testing.T) *currentBundle {
	t.Helper()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	dir := t.TempDir()
	install(t, dir, hosttest.Build(t, "./plugins/counters/chaos"), "1.0.0")
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir, DisablePluginWatch: true,
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0", HistoryRetention: 6 * 24 * time.Hour})
	hosttest.Eventually(t, 10*time.Second, "the admin listener", func() bool { return h.AdminAddr() != "" })
	return &currentBundle{pool: pool, rdb: rdb, stream: stream, base: "http://" + h.AdminAddr(), token: h.AdminToken}
}

// get fetches a console path with the admin token, without following
// redirects.
func (b *currentBundle) get(t *testing.T, path string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("GET", b.base+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.token)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, res.Header, string(body)
}

func (b *currentBundle) page(t *testing.T, path string) string {
	t.Helper()
	code, _, body := b.get(t, path)
	require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	return body
}

// cell is the text of the first element with class class in the row of
// table id whose data-kind is kind.
func cell(t *testing.T, page, kind, class string) string {
	t.Helper()
	row := regexp.MustCompile(`(?s)<tr data-kind="` + regexp.QuoteMeta(kind) + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(page)
	require.NotNil(t, row, "no row of kind %s", kind)
	m := regexp.MustCompile(`<td class="n ` + class + `">([^<]*)</td>`).FindStringSubmatch(row[1])
	require.NotNil(t, m, "no %s in the row of kind %s", class, kind)
	return m[1]
}

// seriesSum sums the values a chart of the kind (figure class figure)
// draws for series.
func seriesSum(t *testing.T, page, figure, kind, series string) float64 {
	t.Helper()
	fig := regexp.MustCompile(`(?s)<figure class="chart ` + figure + `" data-kind="` + regexp.QuoteMeta(kind) + `">(.*?)</figure>`).FindStringSubmatch(page)
	require.NotNil(t, fig, "no %s chart of kind %s", figure, kind)
	m := regexp.MustCompile(`data-series="` + series + `" data-values="([^"]*)"`).FindStringSubmatch(fig[1])
	require.NotNil(t, m, "no %s line in the %s chart of %s", series, figure, kind)
	var sum float64
	for _, v := range strings.Fields(m[1]) {
		f, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err)
		sum += f
	}
	return sum
}

// record inserts a job history record of kind, finished at, as a host
// writes one.
func record(t *testing.T, pool *pgxpool.Pool, job, kind, verdict string, deliveries int, errText string, at time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO job_history (job_id, kind, verdict, guard, deliveries, error, started_at, finished_at)
		VALUES ($1, $2, $3, 'job id recorded', $4, $5, $6, $7)`, job, kind, verdict, deliveries, errText, at.Add(-10*time.Millisecond), at)
	require.NoError(t, err)
}

// The console's pages over HTTP on a running host, each checked against
// the database: the overview's range choice, its retries, reclaims and
// republishes charts, its kinds by activity, a job's payload and its
// download, and the jobs search's pages and filters.
func TestConsoleStaysCurrent(t *testing.T) {
	t.Parallel()
	b := setupCurrent(t)
	ctx := context.Background()
	now := time.Now()

	// A range is one of the choices, drawn in about 60 buckets; the
	// totals are the history's records inside it. Anything else is a 400
	// that lists the choices.
	t.Run("overview range", func(t *testing.T) {
		for i, ago := range []time.Duration{30 * time.Minute, 3 * time.Hour, 20 * time.Hour, 3 * 24 * time.Hour, 8 * 24 * time.Hour} {
			record(t, b.pool, fmt.Sprintf("range-%d", i), "range_kind", "applied", 1, "", now.Add(-ago))
		}
		for _, c := range []struct {
			rng    string
			window time.Duration
			live   string
		}{{"1h", time.Hour, "2"}, {"6h", 6 * time.Hour, "12"}, {"24h", 24 * time.Hour, "48"}, {"7d", 7 * 24 * time.Hour, "336"}} {
			page := b.page(t, "/console/?range="+c.rng)
			require.Contains(t, page, `<div id="overview" data-live="`+c.live+`">`, "a longer range refreshes less often")
			bucket := c.window / 60
			require.Contains(t, page, fmt.Sprintf(`id="chart-window" data-range="%s" data-bucket-seconds="%s"`, c.rng, strconv.FormatFloat(bucket.Seconds(), 'g', -1, 64)))
			require.Contains(t, page, `data-range="`+c.rng+`" aria-current="true"`, "the choice shown chosen")
			// The window is whole buckets ending with now's: its start
			// is at most one bucket later than now minus the range.
			until := time.Now()
			want := hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE kind = 'range_kind'
				AND finished_at >= $1::timestamptz - $2::interval AND finished_at < $1`, until, c.window.String())
			require.Equal(t, strconv.FormatInt(want, 10), cell(t, page, "range_kind", "total"), c.rng)
			points := strings.Count(regexp.MustCompile(`data-series="applied" data-values="([^"]*)"`).FindStringSubmatch(page)[1], " ") + 1
			require.InDelta(t, 60, points, 1, "about 60 buckets in %s", c.rng)
			// The history is kept 6 days: a week's range says so.
			if c.rng == "7d" {
				require.Contains(t, page, `id="beyond-retention">The job history is kept 6d0h: this range goes back further`)
			} else {
				require.NotContains(t, page, `id="beyond-retention"`)
			}
		}
		require.Contains(t, b.page(t, "/console/"), `data-range="1h" aria-current="true"`, "the configured window by default (1h)")
		for _, bad := range []string{"5h", "forever", "-1h"} {
			code, _, body := b.get(t, "/console/?range="+url.QueryEscape(bad))
			require.Equal(t, http.StatusBadRequest, code, bad)
			require.Contains(t, body, fmt.Sprintf(`range=%q is not a range the overview charts: one of 1h, 6h, 24h, 7d`, bad))
		}
	})

	// Retries, reclaims and republishes per bucket, from the history and
	// the republishes' record: still counted once retention deleted the
	// outbox rows.
	t.Run("trouble charts", func(t *testing.T) {
		const kind = "trouble_kind"
		for i := range 4 {
			record(t, b.pool, fmt.Sprintf("t-%d", i), kind, "retry_scheduled", 1, "mail provider unavailable", now.Add(-time.Duration(i+1)*time.Minute))
		}
		for i := range 3 {
			record(t, b.pool, fmt.Sprintf("t-%d", i), kind, "applied", 2, "", now.Add(-time.Duration(i+1)*time.Minute))
		}
		// Two rows whose entries were lost: published an hour ago, never
		// finished; the reconciler hands them back to the relay.
		_, err := b.pool.Exec(ctx, `INSERT INTO outbox (kind, payload, published_at) VALUES ($1, '{}', now() - interval '1 hour'), ($1, '{}', now() - interval '1 hour')`, kind)
		require.NoError(t, err)
		rec, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: b.pool, Redis: b.rdb, Streams: []string{b.stream}, Group: "usher", StaleAfter: time.Minute})
		require.NoError(t, err)
		n, err := rec.Reconcile(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		_, err = b.pool.Exec(ctx, `DELETE FROM outbox WHERE kind = $1`, kind) // retention
		require.NoError(t, err)

		page := b.page(t, "/console/?range=1h")
		retries := hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE kind = $1 AND verdict = 'retry_scheduled'`, kind)
		reclaims := hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE kind = $1 AND deliveries > 1`, kind)
		republishes := hosttest.Count(t, b.pool, `SELECT count(*) FROM job_republishes WHERE kind = $1`, kind)
		require.Equal(t, []int64{4, 3, 2}, []int64{retries, reclaims, republishes})
		require.EqualValues(t, retries, seriesSum(t, page, "trouble", kind, "retries"))
		require.EqualValues(t, reclaims, seriesSum(t, page, "trouble", kind, "reclaims"))
		require.EqualValues(t, republishes, seriesSum(t, page, "trouble", kind, "republishes"))
		require.Equal(t, strconv.FormatInt(retries, 10), cell(t, page, kind, "retry"))
		require.Equal(t, strconv.FormatInt(reclaims, 10), cell(t, page, kind, "reclaimed"))
		require.Equal(t, strconv.FormatInt(republishes, 10), cell(t, page, kind, "republished"))
	})

	// The kinds come busiest first in the range; a kind the host serves
	// with nothing in it comes last, idle.
	t.Run("kinds by activity", func(t *testing.T) {
		for kind, n := range map[string]int{"act_a_two": 2, "act_b_five": 5, "act_c_three": 3} {
			for i := range n {
				record(t, b.pool, fmt.Sprintf("%s-%d", kind, i), kind, "applied", 1, "", now.Add(-time.Hour-time.Duration(i)*time.Minute))
			}
		}
		page := b.page(t, "/console/?range=6h")
		var kinds []string
		for _, m := range regexp.MustCompile(`<tr data-kind="([^"]+)"`).FindAllStringSubmatch(page, -1) {
			kinds = append(kinds, m[1])
		}
		var want []string
		rows, err := b.pool.Query(ctx, `SELECT kind FROM job_history WHERE finished_at >= now() - interval '6 hours'
			GROUP BY kind ORDER BY count(*) DESC, kind`)
		require.NoError(t, err)
		for rows.Next() {
			var k string
			require.NoError(t, rows.Scan(&k))
			want = append(want, k)
		}
		require.NoError(t, rows.Err())
		want = append(want, "update_sales_counter") // served, idle
		require.Equal(t, want, kinds[:len(want)])
		require.Less(t, strings.Index(page, `figure class="chart throughput" data-kind="act_b_five"`), strings.Index(page, `figure class="chart throughput" data-kind="act_c_three"`))
		require.Regexp(t, `<tr data-kind="update_sales_counter" class="idle">`, page)
		require.NotContains(t, page, `figure class="chart throughput" data-kind="update_sales_counter"`, "no charts of an idle kind")
	})

	// A job's page shows its payload pretty-printed and escaped, cut at
	// 4 KiB, with a link that downloads it whole; a payload retention
	// deleted is said to be gone.
	t.Run("payload", func(t *testing.T) {
		big := map[string]any{"note": "<script>alert(1)</script>", "items": strings.Repeat("x", 9000)}
		raw, err := json.Marshal(big)
		require.NoError(t, err)
		ids, err := outbox.Add(ctx, b.pool, outbox.Message{Kind: "payload_kind", Payload: raw}, outbox.Message{Kind: "payload_kind", Payload: []byte(`{"order_id":7,"seats":[1,2]}`)})
		require.NoError(t, err)
		bigJob, smallJob := strconv.FormatInt(ids[0], 10), strconv.FormatInt(ids[1], 10)
		var stored string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE id = $1`, ids[0]).Scan(&stored))

		page := b.page(t, "/console/jobs?id="+bigJob)
		require.Contains(t, page, fmt.Sprintf(`data-bytes="%d"`, len(stored)))
		require.Contains(t, page, `id="payload-cut"`)
		require.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;", "escaped")
		require.NotContains(t, page, "<script>alert(1)")
		shown := regexp.MustCompile(`(?s)<pre class="payload" id="payload-shown">(.*?)</pre>`).FindStringSubmatch(page)
		require.NotNil(t, shown)
		require.LessOrEqual(t, len(shown[1]), 4096+200, "at most 4 KiB of it, escaped")
		require.Contains(t, page, `href="/console/jobs/`+bigJob+`/payload" id="payload-download"`)

		code, hdr, body := b.get(t, "/console/jobs/"+bigJob+"/payload")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "application/json", hdr.Get("Content-Type"))
		require.Equal(t, `attachment; filename="job-`+bigJob+`-payload.json"`, hdr.Get("Content-Disposition"))
		require.Equal(t, stored, body, "the whole payload, as stored")

		page = b.page(t, "/console/jobs?id="+smallJob)
		require.NotContains(t, page, `id="payload-cut"`)
		// Pretty-printed, as jsonb keeps it (shorter keys first).
		require.Contains(t, page, "{\n  &#34;seats&#34;: [\n    1,\n    2\n  ],\n  &#34;order_id&#34;: 7\n}")

		// Its rows deleted by retention: only the history is left.
		record(t, b.pool, bigJob, "payload_kind", "applied", 1, "", now)
		_, err = b.pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, ids[0])
		require.NoError(t, err)
		page = b.page(t, "/console/jobs?id="+bigJob)
		require.Contains(t, page, `<p id="payload-gone" class="bad">The payload is no longer kept: outbox retention deleted the job&#39;s rows and no dead letter holds it.</p>`)
		code, _, body = b.get(t, "/console/jobs/"+bigJob+"/payload")
		require.Equal(t, http.StatusNotFound, code)
		require.Contains(t, body, "no longer kept")
	})

	// The jobs search pages by 200 with an honest total, and searches by
	// creation time and by the last error's text; bad input is a 400
	// that says why.
	t.Run("jobs paging and search", func(t *testing.T) {
		const kind = "paging_job"
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		// 450 done rows, a minute apart (the relay leaves published rows).
		_, err := b.pool.Exec(ctx, `INSERT INTO outbox (kind, payload, created_at, published_at, done_at, outcome)
			SELECT $1, '{}', $2::timestamptz + i * interval '1 minute', now(), now(), 'applied' FROM generate_series(0, 449) i`, kind, t0)
		require.NoError(t, err)
		total := hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1`, kind)
		require.EqualValues(t, 450, total)
		shown := func(page string) (string, string) {
			m := regexp.MustCompile(`<span id="jobs-shown">([^<]*)</span> of <span id="jobs-total">([^<]*)</span>`).FindStringSubmatch(page)
			require.NotNil(t, m, "no paging line")
			return m[1], m[2]
		}
		link := func(page, id string) string {
			m := regexp.MustCompile(`<a href="([^"]*)" id="` + id + `">`).FindStringSubmatch(page)
			if m == nil {
				return ""
			}
			return strings.ReplaceAll(m[1], "&amp;", "&")
		}
		rowsOf := func(page string) int { return strings.Count(page, `<tr data-job=`) }

		page := b.page(t, "/console/jobs?kind="+kind)
		from, of := shown(page)
		require.Equal(t, []string{"1–200", "450"}, []string{from, of})
		require.Equal(t, 200, rowsOf(page))
		require.Empty(t, link(page, "jobs-first"))
		page = b.page(t, link(page, "jobs-next"))
		from, of = shown(page)
		require.Equal(t, []string{"201–400", "450"}, []string{from, of})
		require.NotEmpty(t, link(page, "jobs-first"))
		page = b.page(t, link(page, "jobs-next"))
		from, of = shown(page)
		require.Equal(t, []string{"401–450", "450"}, []string{from, of})
		require.Equal(t, 50, rowsOf(page))
		require.Empty(t, link(page, "jobs-next"), "no page after the last")
		require.Contains(t, link(page, "jobs-first"), "kind="+kind, "the first page keeps the search")

		// A time range: the rows created in [from, to).
		q := url.Values{"kind": {kind}, "from": {"2026-03-01T13:00"}, "to": {"2026-03-01T14:30:00Z"}}
		page = b.page(t, "/console/jobs?"+q.Encode())
		want := hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1 AND created_at >= '2026-03-01T13:00:00Z' AND created_at < '2026-03-01T14:30:00Z'`, kind)
		require.EqualValues(t, 90, want)
		from, of = shown(page)
		require.Equal(t, []string{"1–90", "90"}, []string{from, of})

		// The last error: a job whose later delivery failed otherwise is
		// matched by that error only.
		var ids []int64
		rows, err := b.pool.Query(ctx, `SELECT id FROM outbox WHERE kind = $1 ORDER BY id LIMIT 5`, kind)
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		for i, id := range ids {
			job := strconv.FormatInt(id, 10)
			record(t, b.pool, job, kind, "retry_scheduled", 1, "dial tcp: Connection REFUSED by smtp.example", now.Add(-time.Minute))
			if i == 0 {
				record(t, b.pool, job, kind, "dead_letter", 1, "order 9 does not exist", now)
			}
		}
		page = b.page(t, "/console/jobs?"+url.Values{"kind": {kind}, "error": {"connection refused"}}.Encode())
		from, of = shown(page)
		require.Equal(t, []string{"1–4", "4"}, []string{from, of}, "the first job's last error is another")
		require.Contains(t, page, "dial tcp: Connection REFUSED by smtp.example")
		page = b.page(t, "/console/jobs?"+url.Values{"kind": {kind}, "error": {"DOES NOT EXIST"}}.Encode())
		from, of = shown(page)
		require.Equal(t, []string{"1–1", "1"}, []string{from, of})
		require.Contains(t, page, fmt.Sprintf(`<tr data-job="%d">`, ids[0]))

		for q, reason := range map[string]string{
			"from=yesterday": `jobs search: from="yesterday" is not a time: give one as 2026-03-01T12:00 (UTC) or RFC 3339`,
			"to=2026-13-01":  `to="2026-13-01" is not a time`,
			"from=2026-03-02T00:00&to=2026-03-01T00:00": "jobs search: from 2026-03-02T00:00:00Z is after to 2026-03-01T00:00:00Z",
			"offset=abc":     `offset="abc" is not a count of jobs`,
			"state=done-ish": `no state "done-ish"`,
			"from=2026-03-01T12:00:00%2B01:00&to=2026-03": `to="2026-03" is not a time`,
		} {
			code, _, body := b.get(t, "/console/jobs?"+q)
			require.Equal(t, http.StatusBadRequest, code, q)
			require.Contains(t, body, reason, q)
		}
	})
}

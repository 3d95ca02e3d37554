package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/pause"
)

var funcs = template.FuncMap{
	"svg": func(s string) template.HTML { return template.HTML(s) }, // drawChart escapes its text
	"ago": func(t time.Time) string { return ops.HumanDuration(time.Since(t)) },
	"dur": ops.HumanDuration,
	"utc": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"ms":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + " ms" },
	// outcomes are the outcomes the host writes on an outbox row, offered
	// by the jobs search.
	"states": func() []string { return history.States },
	"human":  ops.HumanDuration,
	// attempt names an attempt by its number and ordinal, "0 (1st)", as
	// the CLI does.
	"attempt": ops.Attempt,
	"cap":     func() string { return strconv.Itoa(payloadCap) },
	"since":   func(from, to time.Time) time.Duration { return to.Sub(from) },
	"wfpath":  workflowPath,
	// wfnode carries a workflow's job and the prefix into the recursive
	// template that draws the tree.
	"wfnode": func(j *history.Job, prefix string) map[string]any { return map[string]any{"J": j, "Prefix": prefix} },
	"text":   func(b []byte) string { return deadletter.Text(string(b)) },
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12] + "…"
		}
		return s
	},
}

func (c *Console) routes() {
	m := http.NewServeMux()
	assets, _ := fs.Sub(assetFS, "assets") // the directory is embedded
	m.Handle("GET "+Prefix+"assets/", http.StripPrefix(Prefix+"assets/", http.FileServerFS(assets)))
	m.HandleFunc("GET "+Prefix+"login", c.loginForm)
	m.HandleFunc("POST "+Prefix+"login", c.login)
	m.HandleFunc("POST "+Prefix+"logout", c.authed(c.logout))
	m.HandleFunc("GET "+Prefix+"{$}", c.authed(c.overview))
	m.HandleFunc("GET "+Prefix+"deadletters", c.authed(c.deadLetters))
	m.HandleFunc("GET "+Prefix+"deadletters/{id}", c.authed(c.deadLetter))
	m.HandleFunc("POST "+Prefix+"deadletters/{id}/requeue", c.authed(c.requeueOne))
	m.HandleFunc("POST "+Prefix+"deadletters/requeue", c.authed(c.requeueKind))
	m.HandleFunc("GET "+Prefix+"plugins", c.authed(c.plugins))
	m.HandleFunc("POST "+Prefix+"plugins/reload", c.authed(c.reload))
	m.HandleFunc("GET "+Prefix+"jobs", c.authed(c.jobs))
	m.HandleFunc("GET "+Prefix+"jobs/{id}/payload", c.authed(c.payload))
	c.workflowRoutes(m)
	c.actionRoutes(m)
	c.mux = m
}

// render writes page with data; data's "Flash" is the message a POST
// redirected with (?msg=).
func (c *Console) render(w http.ResponseWriter, r *http.Request, page string, data map[string]any) {
	c.renderStatus(w, r, http.StatusOK, page, data)
}

func (c *Console) renderStatus(w http.ResponseWriter, r *http.Request, status int, page string, data map[string]any) {
	data["Page"] = page
	data["Flash"] = r.URL.Query().Get("msg")
	data["Prefix"] = Prefix
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, data); err != nil {
		c.log.Error("console: render", "page", page, "err", err)
		http.Error(w, "console: render "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.log.Warn("console: page failed", "path", r.URL.Path, "err", err)
	c.renderStatus(w, r, http.StatusInternalServerError, "error.html", map[string]any{"Error": err.Error()})
}

// back redirects a POST to to, with msg shown there.
func back(w http.ResponseWriter, r *http.Request, to, msg string) {
	u, _ := url.Parse(to)
	q := u.Query()
	q.Set("msg", msg)
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	rng, err := c.chosenRange(r.URL.Query().Get("range"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := c.cfg.Now()
	in, err := ops.Inspect(ctx, c.cfg.Pool, c.cfg.Redis, c.cfg.Stream, c.cfg.Group, now)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	// The window ends with the bucket now is in: its point grows until
	// the bucket is over.
	until := ops.BucketStart(now, rng.Bucket).Add(rng.Bucket)
	since := until.Add(-rng.Window)
	buckets, err := ops.Throughput(ctx, c.cfg.Pool, since, until, rng.Bucket)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	republished, err := ops.Republishes(ctx, c.cfg.Pool, since, until, rng.Bucket)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var served []string
	for _, p := range c.cfg.Plugins(ctx) {
		for _, k := range p.Kinds {
			served = append(served, k.Kind)
		}
	}
	lats, err := ops.Latencies(ctx, c.cfg.Pool, since, until)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	latency := map[string]ops.Latency{}
	for _, l := range lats {
		latency[l.Kind] = l
	}
	c.render(w, r, "overview.html", map[string]any{"In": in, "Lag": in.Lag, "DeadOpen": in.DeadLettersOpen(),
		"Charts": buildCharts(buckets, republished, served, since, until, rng.Bucket), "Latency": latency, "LatencySample": ops.LatencySample,
		"Range": rng, "Ranges": c.ranges(), "Live": liveSeconds(rng.Window), "Retention": c.cfg.HistoryRetention,
		"BeyondRetention": c.cfg.HistoryRetention > 0 && rng.Window > c.cfg.HistoryRetention})
}

// liveEvery is how often, in seconds, the jobs, a job's, the dead
// letters', a dead letter's, the workflows', the schedules' and the
// plugins' pages ask for themselves again (console.js, data-live) while
// what they show can change; the overview's depends on its range
// (liveSeconds).
const liveEvery = 3

// letterPage is how many dead letters one page of the console lists.
const letterPage = 200

// letterPageInfo is where a page of dead letters is in the whole list:
// letters From to To (counted from 1, oldest first) of Total open; After
// is the id the page starts after (0: the first page), Next the id the
// next page starts after (0: none).
type letterPageInfo struct {
	From, To, Total int64
	After, Next     int64
}

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	kind := r.URL.Query().Get("kind")
	var after int64
	if v := r.URL.Query().Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("after=%q is not a dead letter id", v), http.StatusBadRequest)
			return
		}
		after = n
	}
	letters, err := deadletter.ListAfter(r.Context(), c.cfg.Pool, kind, after, letterPage)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	total, before, err := deadletter.CountOpen(r.Context(), c.cfg.Pool, kind, after)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	page := letterPageInfo{From: before + 1, To: before + int64(len(letters)), Total: total, After: after}
	if n := len(letters); n > 0 && before+int64(n) < total {
		page.Next = letters[n-1].ID
	}
	in, err := ops.Inspect(r.Context(), c.cfg.Pool, c.cfg.Redis, c.cfg.Stream, c.cfg.Group, c.cfg.Now())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "deadletters.html", map[string]any{"Kind": kind, "Letters": letters, "Kinds": in.DeadLetters,
		"Forged": deadletter.ForgedKind, "Paging": page, "PageSize": letterPage, "Live": liveEvery})
}

func letterID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%q is not a dead letter ID", r.PathValue("id"))
	}
	return id, nil
}

func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := letterID(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	l, err := deadletter.Get(r.Context(), c.cfg.Pool, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	data := map[string]any{"L": l, "Forged": deadletter.ForgedKind}
	// An open letter's page refreshes itself until it is requeued or
	// discarded (here or elsewhere), then drops its buttons.
	if l.RequeuedAt == nil && l.DiscardedAt == nil {
		data["Live"] = liveEvery
	}
	c.render(w, r, "deadletter.html", data)
}

func (c *Console) requeueOne(w http.ResponseWriter, r *http.Request) {
	id, err := letterID(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	jobs, err := jobctl.Requeue(r.Context(), c.cfg.Pool, []int64{id}, c.actor(r))
	if err != nil {
		back(w, r, Prefix+"deadletters/"+strconv.FormatInt(id, 10), "requeue failed: "+err.Error())
		return
	}
	c.log.Info("console: dead letter requeued", "id", id, "remote", r.RemoteAddr)
	back(w, r, Prefix+"deadletters", fmt.Sprintf("requeued %d dead letter(s) through the outbox, identities kept", len(jobs)))
}

func (c *Console) requeueKind(w http.ResponseWriter, r *http.Request) {
	kind := r.PostFormValue("kind")
	if kind == "" {
		back(w, r, Prefix+"deadletters", "requeue by kind needs a kind")
		return
	}
	jobs, err := jobctl.RequeueKind(r.Context(), c.cfg.Pool, kind, c.actor(r))
	n := len(jobs)
	if err != nil {
		back(w, r, Prefix+"deadletters?kind="+url.QueryEscape(kind), "requeue failed: "+err.Error())
		return
	}
	c.log.Info("console: dead letters requeued", "kind", kind, "count", n, "remote", r.RemoteAddr)
	back(w, r, Prefix+"deadletters", fmt.Sprintf("requeued %d dead letter(s) of kind %s through the outbox, identities kept", n, kind))
}

func (c *Console) plugins(w http.ResponseWriter, r *http.Request) {
	list, err := pause.List(r.Context(), c.cfg.Pool)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	paused := make(map[string]*pause.Paused, len(list))
	for i := range list {
		paused[list[i].Kind] = &list[i]
	}
	c.render(w, r, "plugins.html", map[string]any{"Plugins": c.cfg.Plugins(r.Context()), "Now": c.cfg.Now(), "Paused": paused, "Live": liveEvery})
}

func (c *Console) reload(w http.ResponseWriter, r *http.Request) {
	name := r.PostFormValue("name")
	// A swap, once asked for, completes even if the browser goes away.
	res, err := c.cfg.Reload(context.WithoutCancel(r.Context()), name)
	var parts []string
	for _, x := range res {
		p := x.Plugin + ": " + x.Action
		if x.From != "" || x.To != "" {
			p += fmt.Sprintf(" (%s → %s)", x.From, x.To)
		}
		if x.Error != "" {
			p += ": " + x.Error
		}
		parts = append(parts, p)
	}
	if err != nil {
		parts = append(parts, "reload failed: "+err.Error())
	}
	msg := strings.Join(parts, "; ")
	if msg == "" {
		msg = "reload: no plugin to reload"
	}
	c.log.Info("console: plugins reloaded", "name", name, "remote", r.RemoteAddr, "err", err)
	back(w, r, Prefix+"plugins", msg)
}

// jobPage is how many jobs one page of the jobs search lists.
const jobPage = 200

// jobPageInfo is where a page of the jobs search is in all the jobs it
// matches: jobs From to To (counted from 1, newest first) of Total; Next
// and First are the links to the next page and the first ("" for none).
type jobPageInfo struct {
	From, To, Total int
	Next, First     string
}

// jobFilter reads the jobs search's form. from and to are UTC times, as
// RFC 3339 or as a datetime-local field sends them; a bad one, or from
// after to, is an error that says so.
func jobFilter(q url.Values) (history.Filter, error) {
	f := history.Filter{ID: strings.TrimSpace(q.Get("id")), Kind: strings.TrimSpace(q.Get("kind")), State: strings.TrimSpace(q.Get("state")),
		RequestID: strings.TrimSpace(q.Get("request")), Error: strings.TrimSpace(q.Get("error")), Limit: jobPage}
	var err error
	if f.From, err = formTime("from", q.Get("from")); err != nil {
		return f, err
	}
	if f.To, err = formTime("to", q.Get("to")); err != nil {
		return f, err
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return f, fmt.Errorf("offset=%q is not a count of jobs", v)
		}
		f.Offset = n
	}
	return f, f.Check()
}

// formLayouts are the time forms the jobs search takes, read as UTC when
// they carry no zone.
var formLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

func formTime(name, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	for _, l := range formLayouts {
		if t, err := time.ParseInLocation(l, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s=%q is not a time: give one as 2026-03-01T12:00 (UTC) or RFC 3339 (2026-03-01T12:00:00Z)", name, v)
}

// jobs is the jobs search: the jobs history.List selects (the same list
// `host jobs list` prints, from the outbox rows or, once retention
// deleted them, from what it kept), a page at a time.
func (c *Console) jobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := jobFilter(q)
	if err != nil {
		http.Error(w, "jobs search: "+err.Error(), http.StatusBadRequest)
		return
	}
	jobs, total, err := history.List(r.Context(), c.cfg.Pool, f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	page := jobPageInfo{From: f.Offset + 1, To: f.Offset + len(jobs), Total: total}
	link := func(offset int) string {
		v := url.Values{}
		for k, vs := range q {
			if k != "offset" && k != "msg" && len(vs) > 0 && vs[0] != "" {
				v.Set(k, vs[0])
			}
		}
		if offset > 0 {
			v.Set("offset", strconv.Itoa(offset))
		}
		return Prefix + "jobs?" + v.Encode()
	}
	if page.To < total && len(jobs) > 0 {
		page.Next = link(page.To)
	}
	if f.Offset > 0 {
		page.First = link(0)
	}
	data := map[string]any{"F": f, "Jobs": jobs, "Paging": page, "PageSize": jobPage,
		"FromText": q.Get("from"), "ToText": q.Get("to")}
	// A page searched for one job or request refreshes itself until every
	// job in it is final; a search of many, always.
	live := f.ID == "" && f.RequestID == ""
	// One job searched by id: its state and every delivery's record, as
	// `host jobs show ID` prints them.
	if f.ID != "" {
		job, err := history.GetJob(r.Context(), c.cfg.Pool, f.ID)
		switch {
		case errors.Is(err, history.ErrNotFound):
		case err != nil:
			c.fail(w, r, err)
			return
		default:
			data["Job"] = job
			data["Payload"] = viewPayload(job.ID, job.Payload)
			data["JobLive"] = !history.Final(job.State)
			live = live || !history.Final(job.State)
		}
	}
	// A request searched: the jobs it started, as a tree (`host workflows
	// show`).
	if f.RequestID != "" {
		wf, err := history.GetWorkflow(r.Context(), c.cfg.Pool, f.RequestID)
		switch {
		case errors.Is(err, history.ErrNotFound):
		case err != nil:
			c.fail(w, r, err)
			return
		default:
			data["Workflow"] = wf
			tl := buildRequestTimeline(wf, c.cfg.Now())
			if len(tl.Lanes) > 0 {
				data["Timeline"] = drawTimeline(tl)
			}
			for _, n := range wf.All() {
				if !history.Final(n.State) {
					data["WorkflowLive"], live = true, true
				}
			}
		}
	}
	if live {
		data["Live"] = liveEvery
	}
	c.render(w, r, "jobs.html", data)
}

package console

import (
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/recurring"
	"github.com/usherhq/usher/host/workflow"
	"github.com/usherhq/usher/internal/wfmsg"
)

// The durable workflows' pages: the list (by type and state), one
// workflow's timeline with its history, the actions an operator takes on
// a running one (cancel, signal), and the schedules. Every action is also
// in the CLI (`host workflows cancel|signal`, `host schedules pause|resume|delete`)
// and is recorded in operator_actions with who acted (Console.actor).

func (c *Console) workflowRoutes(m *http.ServeMux) {
	m.HandleFunc("GET "+Prefix+"workflows", c.authed(c.workflows))
	m.HandleFunc("GET "+Prefix+"workflows/{type}/{id}", c.authed(c.workflow))
	m.HandleFunc("POST "+Prefix+"workflows/{type}/{id}/cancel", c.authed(c.cancelWorkflow))
	m.HandleFunc("POST "+Prefix+"workflows/{type}/{id}/signal", c.authed(c.signalWorkflow))
	m.HandleFunc("GET "+Prefix+"schedules", c.authed(c.schedules))
	m.HandleFunc("POST "+Prefix+"schedules/{name}/{action}", c.authed(c.pauseSchedule))
}

// workflowPage is how many workflows one page of the list shows.
const workflowPage = 200

func (c *Console) workflows(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := workflow.Filter{Type: q.Get("type"), State: q.Get("state"), Limit: workflowPage}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			http.Error(w, fmt.Sprintf("after=%q is not a workflow id", v), http.StatusBadRequest)
			return
		}
		f.After = n
	}
	list, err := workflow.List(r.Context(), c.cfg.Pool, f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	total, before, err := workflow.Count(r.Context(), c.cfg.Pool, f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	// The dead letters' paging: rows From to To (from 1, newest first)
	// of Total, Next the id the next page starts after (0: none).
	page := letterPageInfo{From: before + 1, To: before + int64(len(list)), Total: total, After: f.After}
	if n := len(list); n > 0 && before+int64(n) < total {
		page.Next = list[n-1].ID
	}
	var counts []struct {
		State string
		N     int64
	}
	rows, err := c.cfg.Pool.Query(r.Context(), `SELECT state, count(*) FROM workflows WHERE $1 = '' OR type = $1 GROUP BY state ORDER BY state`, f.Type)
	if err == nil {
		counts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
			State string
			N     int64
		}])
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "workflows.html", map[string]any{"F": f, "List": list, "Paging": page, "PageSize": workflowPage,
		"Counts": counts, "States": workflow.States, "Live": liveEvery})
}

func (c *Console) workflow(w http.ResponseWriter, r *http.Request) {
	typ, id := r.PathValue("type"), r.PathValue("id")
	wf, err := workflow.GetByRequestID(r.Context(), c.cfg.Pool, workflow.RequestID(typ, id))
	if errors.Is(err, workflow.ErrNotFound) {
		c.renderStatus(w, r, http.StatusNotFound, "error.html", map[string]any{"Error": fmt.Sprintf("no %s workflow %q", typ, id)})
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	tl := buildTimeline(wf, c.cfg.Now())
	data := map[string]any{"W": wf, "T": tl, "SVG": drawTimeline(tl)}
	if wf.State == "running" { // it refreshes itself until it ends
		data["Live"] = liveEvery
	}
	c.render(w, r, "workflow.html", data)
}

// workflowPath is a workflow's page.
func workflowPath(typ, id string) string {
	return Prefix + "workflows/" + url.PathEscape(typ) + "/" + url.PathEscape(id)
}

func (c *Console) cancelWorkflow(w http.ResponseWriter, r *http.Request) {
	typ, id := r.PathValue("type"), r.PathValue("id")
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = "cancelled from the console"
	}
	var asked bool
	err := pgx.BeginFunc(r.Context(), c.cfg.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(r.Context(), `SELECT usher_cancel_workflow($1, $2, $3)`, typ, id, reason).Scan(&asked); err != nil {
			return err
		}
		return c.recordAction(r, tx, "workflow cancel", workflow.RequestID(typ, id), reason)
	})
	msg := "cancel asked: the steps not started are cancelled, and the workflow decides its compensation"
	switch {
	case err != nil:
		msg = "cancel failed: " + err.Error()
	case !asked:
		msg = "a cancel was asked before: nothing more recorded"
	}
	c.log.Info("console: workflow cancel", "type", typ, "id", id, "remote", r.RemoteAddr, "err", err)
	back(w, r, workflowPath(typ, id), msg)
}

func (c *Console) signalWorkflow(w http.ResponseWriter, r *http.Request) {
	typ, id := r.PathValue("type"), r.PathValue("id")
	name, sid := strings.TrimSpace(r.PostFormValue("name")), strings.TrimSpace(r.PostFormValue("signal_id"))
	payload := strings.TrimSpace(r.PostFormValue("payload"))
	if payload == "" {
		payload = "null"
	}
	var err error
	switch {
	case name == "":
		err = errors.New("a signal needs a name")
	case sid == "":
		err = errors.New("a signal needs an id (a second signal with the same id counts once)")
	case len(payload) > wfmsg.MaxSignalBytes:
		err = fmt.Errorf("a payload of %d bytes is over the limit of %d (wfmsg.MaxSignalBytes)", len(payload), wfmsg.MaxSignalBytes)
	}
	var recorded bool
	if err == nil {
		err = pgx.BeginFunc(r.Context(), c.cfg.Pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(r.Context(), `SELECT usher_signal_workflow($1, $2, $3, $4, $5::jsonb)`, typ, id, sid, name, payload).Scan(&recorded); err != nil {
				return err
			}
			return c.recordAction(r, tx, "workflow signal", workflow.RequestID(typ, id), name+" "+sid)
		})
	}
	msg := fmt.Sprintf("signal %s (%s) recorded", name, sid)
	switch {
	case err != nil:
		msg = "signal failed: " + err.Error()
	case !recorded:
		msg = fmt.Sprintf("signal id %s was received before: it counts once, nothing more recorded", sid)
	}
	c.log.Info("console: workflow signal", "type", typ, "id", id, "signal", name, "remote", r.RemoteAddr, "err", err)
	back(w, r, workflowPath(typ, id), msg)
}

func (c *Console) recordAction(r *http.Request, tx pgx.Tx, action, target, detail string) error {
	_, err := tx.Exec(r.Context(), `INSERT INTO operator_actions (actor, action, target, detail) VALUES ($1, $2, $3, $4)`,
		c.actor(r), action, target, detail)
	return err
}

func (c *Console) schedules(w http.ResponseWriter, r *http.Request) {
	list, err := recurring.List(r.Context(), c.cfg.Pool)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "schedules.html", map[string]any{"List": list, "Live": liveEvery})
}

func (c *Console) pauseSchedule(w http.ResponseWriter, r *http.Request) {
	name, action := r.PathValue("name"), r.PathValue("action")
	var err error
	switch action {
	case "pause", "resume":
		_, err = recurring.SetPaused(r.Context(), c.cfg.Pool, name, action == "pause", c.cfg.Now())
	case "delete":
		err = recurring.Delete(r.Context(), c.cfg.Pool, name)
	default:
		http.Error(w, "no such action: "+action, http.StatusNotFound)
		return
	}
	msg := fmt.Sprintf("schedule %s %sd", name, action)
	if err == nil {
		err = pgx.BeginFunc(r.Context(), c.cfg.Pool, func(tx pgx.Tx) error { return c.recordAction(r, tx, "schedule "+action, name, "") })
	}
	if err != nil {
		msg = action + " failed: " + err.Error()
	}
	c.log.Info("console: schedule "+action, "name", name, "remote", r.RemoteAddr, "err", err)
	back(w, r, Prefix+"schedules", msg)
}

// timeline is one workflow's history laid out in time: a lane per step
// (scheduled until it ended), a lane per timer (set until it fired), and
// the instants (signals, the cancel request, the decisions' events) as
// marks.
type timeline struct {
	Start, End time.Time
	Lanes      []lane
	Marks      []mark
	Rows       []eventRow
}

// lane is one row of a timeline: a durable workflow's step or timer (one
// bar, From to To), or a request's job (a bar per delivery).
type lane struct {
	Name, Kind, State string
	From, To          time.Time
	Open              bool // still running at End
	// Depth indents the lane's name: a job under the job that enqueued
	// it. Link, when set, is where its name leads.
	Depth int
	Link  string
	Bars  []bar
}

// bar is one span of a lane: its state colours it, Title is its tooltip.
type bar struct {
	From, To     time.Time
	State, Title string
}

type mark struct {
	At         time.Time
	Type, Name string
}

// eventRow is one event with its offset from the workflow's start.
type eventRow struct {
	workflow.Event
	Offset time.Duration
}

func buildTimeline(wf *workflow.Workflow, now time.Time) timeline {
	t := timeline{Start: wf.CreatedAt, End: now}
	if wf.FinishedAt != nil {
		t.End = *wf.FinishedAt
	}
	if len(wf.Events) > 0 && wf.Events[0].At.Before(t.Start) {
		t.Start = wf.Events[0].At
	}
	for _, e := range wf.Events {
		if e.At.After(t.End) {
			t.End = e.At
		}
	}
	steps := map[string]int{}
	timers := map[string]int{}
	for _, e := range wf.Events {
		t.Rows = append(t.Rows, eventRow{Event: e, Offset: e.At.Sub(t.Start)})
		switch e.Type {
		case "step_scheduled":
			steps[e.Name] = len(t.Lanes)
			t.Lanes = append(t.Lanes, lane{Name: "step " + e.Name, Kind: e.Detail, State: "running", From: e.At, Open: true})
		case "step_completed", "step_failed", "step_cancelled":
			if i, ok := steps[e.Name]; ok {
				t.Lanes[i].To, t.Lanes[i].Open = e.At, false
				t.Lanes[i].State = strings.TrimPrefix(e.Type, "step_")
			}
		case "timer_set":
			timers[e.Name] = len(t.Lanes)
			t.Lanes = append(t.Lanes, lane{Name: "timer " + e.Name, Kind: "timer", State: "set", From: e.At, Open: true})
		case "timer_fired":
			if i, ok := timers[e.Name]; ok {
				t.Lanes[i].To, t.Lanes[i].Open, t.Lanes[i].State = e.At, false, "fired"
			}
		case "signal_received", "cancel_requested", "started", "completed", "failed", "cancelled", "migrated":
			t.Marks = append(t.Marks, mark{At: e.At, Type: e.Type, Name: e.Name})
		}
	}
	for i := range t.Lanes {
		l := &t.Lanes[i]
		if l.Open {
			l.To = t.End
		}
		l.Bars = []bar{{From: l.From, To: l.To, State: l.State,
			Title: fmt.Sprintf("%s (%s): %s, %s", l.Name, l.Kind, l.State, ops.HumanDuration(l.To.Sub(l.From)))}}
	}
	sort.SliceStable(t.Marks, func(i, j int) bool { return t.Marks[i].At.Before(t.Marks[j].At) })
	return t
}

// buildRequestTimeline lays out the jobs one request started in time: a
// lane per job, in the tree's order (a job under the job that enqueued
// it), with a bar per delivery from its start to its outcome, coloured
// by its verdict. It ends now while a job is not final, else at the last
// outcome. No delivery recorded: no lanes.
func buildRequestTimeline(wf *history.Workflow, now time.Time) timeline {
	t := timeline{Start: wf.FirstStart()}
	if t.Start.IsZero() {
		return timeline{}
	}
	var open bool
	var walk func(jobs []*history.Job, depth int)
	walk = func(jobs []*history.Job, depth int) {
		for _, j := range jobs {
			l := lane{Name: j.Kind + " " + j.ID, Kind: j.Kind, State: j.State, Depth: depth, Link: Prefix + "jobs?id=" + url.QueryEscape(j.ID)}
			open = open || !history.Final(j.State)
			for _, r := range j.History {
				l.Bars = append(l.Bars, bar{From: r.StartedAt, To: r.FinishedAt, State: string(r.Verdict),
					Title: fmt.Sprintf("%s, attempt %s, delivery %d: %s after %s on %s%s", l.Name, ops.Attempt(r.Attempt), r.Deliveries,
						r.Verdict, ops.HumanDuration(r.Duration()), r.Consumer, strings.TrimPrefix(" ("+r.Reason+")", " ()"))})
				if r.FinishedAt.After(t.End) {
					t.End = r.FinishedAt
				}
			}
			t.Lanes = append(t.Lanes, l)
			walk(j.Children, depth+1)
		}
	}
	walk(wf.Jobs, 0)
	if open && now.After(t.End) {
		t.End = now
	}
	return t
}

// Timeline geometry, in SVG user units.
const (
	tlW, tlLabel, tlRow, tlTop = 760, 200, 22, 30
)

// laneColors by a bar's state: a durable workflow's step or timer, or a
// delivery's verdict (colour-blind safe, as the charts').
var laneColors = map[string]string{"completed": "#1b7837", "failed": "#b2182b", "cancelled": "#4d4d4d",
	"running": "#2166ac", "set": "#e08214", "fired": "#762a83",
	string(outcome.Applied): "#1b7837", string(outcome.Absorbed): "#5aae61", string(outcome.RetryScheduled): "#e08214",
	string(outcome.DeadLettered): "#b2182b", string(outcome.Abandoned): "#8c510a"} // outcome.Cancelled is "cancelled"

// drawTimeline draws t as an SVG: a time axis from the timeline's start,
// each lane's bars and a line per mark, each with a title (its tooltip).
// Every text is escaped: it is inserted into the page as HTML.
func drawTimeline(t timeline) string {
	span := t.End.Sub(t.Start)
	if span <= 0 {
		span = time.Millisecond
	}
	plot := float64(tlW - tlLabel - 20)
	x := func(at time.Time) float64 {
		return float64(tlLabel) + plot*float64(at.Sub(t.Start))/float64(span)
	}
	h := tlTop + tlRow*len(t.Lanes) + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="timeline" id="timeline-svg" role="img" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg"><title>%s</title>`,
		tlW, h, html.EscapeString("timeline over "+ops.HumanDuration(span)))
	for i := 0; i <= 4; i++ {
		at := t.Start.Add(span * time.Duration(i) / 4)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="14" font-size="10" text-anchor="middle">+%s</text>`,
			x(at), tlTop-8, x(at), h-10, x(at), html.EscapeString(ops.HumanDuration(at.Sub(t.Start))))
	}
	for i, l := range t.Lanes {
		y := tlTop + i*tlRow
		fmt.Fprintf(&b, `<g class="lane" data-lane="%s" data-state="%s" data-depth="%d">`, html.EscapeString(l.Name), html.EscapeString(l.State), l.Depth)
		name := fmt.Sprintf(`<text x="%d" y="%d" font-size="11">%s</text>`, 4+12*l.Depth, y+14, html.EscapeString(strings.Repeat("└ ", min(l.Depth, 1))+l.Name))
		if l.Link != "" {
			name = `<a href="` + html.EscapeString(l.Link) + `">` + name + `</a>`
		}
		b.WriteString(name)
		for _, r := range l.Bars {
			fmt.Fprintf(&b, `<rect class="bar" data-state="%s" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`,
				html.EscapeString(r.State), x(r.From), y+3, max(x(r.To)-x(r.From), 2), tlRow-8, laneColors[r.State], html.EscapeString(r.Title))
		}
		b.WriteString(`</g>`)
	}
	for _, m := range t.Marks {
		fmt.Fprintf(&b, `<line class="mark" data-mark="%s" x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-dasharray="2,2"><title>%s</title></line>`,
			html.EscapeString(m.Type), x(m.At), tlTop-8, x(m.At), h-10,
			html.EscapeString(strings.TrimSpace(m.Type+" "+m.Name)+" at +"+ops.HumanDuration(m.At.Sub(t.Start))))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

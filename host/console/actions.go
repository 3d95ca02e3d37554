package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/pause"
)

// The actions an operator takes on jobs, dead letters, kinds and plugins:
// cancel a job no host has started (one on the stream by request: a run
// already started finishes), run a scheduled job now, discard a
// dead letter, requeue a chosen set, pause and resume a kind, roll back a
// plugin. Each is also in the CLI (`host jobs cancel|run-now`, `host
// deadletters discard|requeue ID...`, `host kinds pause|resume`, `host
// plugins rollback`) and the admin API, and is recorded in
// operator_actions with who acted (Console.actor: "NAME via the console
// from ADDR"), as the workflow actions are.

func (c *Console) actionRoutes(m *http.ServeMux) {
	m.HandleFunc("POST "+Prefix+"jobs/{id}/cancel", c.authed(c.cancelJob))
	m.HandleFunc("POST "+Prefix+"jobs/{id}/run-now", c.authed(c.runJobNow))
	m.HandleFunc("POST "+Prefix+"deadletters/{id}/discard", c.authed(c.discardLetter))
	m.HandleFunc("POST "+Prefix+"deadletters/requeue-set", c.authed(c.requeueSet))
	m.HandleFunc("POST "+Prefix+"kinds/{kind}/{action}", c.authed(c.pauseKind))
	m.HandleFunc("POST "+Prefix+"plugins/{name}/rollback", c.authed(c.rollback))
}

// jobPath is a job's page.
func jobPath(id string) string { return Prefix + "jobs?id=" + url.QueryEscape(id) }

func (c *Console) cancelJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = "cancelled from the console"
	}
	res, err := jobctl.Cancel(r.Context(), c.cfg.Pool, id, c.actor(r), reason)
	msg := res.String()
	if err != nil {
		msg = "cancel failed: " + err.Error()
	}
	c.log.Info("console: job cancel", "job_id", id, "remote", r.RemoteAddr, "err", err)
	back(w, r, jobPath(id), msg)
}

func (c *Console) runJobNow(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	was, err := jobctl.RunNow(r.Context(), c.cfg.Pool, id, c.actor(r))
	msg := fmt.Sprintf("job %s is due now (was due %s): the scheduler moves it to the outbox within a second", id, was.UTC().Format(time.RFC3339))
	if err != nil {
		msg = "run now failed: " + err.Error()
	}
	c.log.Info("console: job run now", "job_id", id, "remote", r.RemoteAddr, "err", err)
	back(w, r, jobPath(id), msg)
}

func (c *Console) discardLetter(w http.ResponseWriter, r *http.Request) {
	id, err := letterID(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	job, err := jobctl.Discard(r.Context(), c.cfg.Pool, id, c.actor(r), strings.TrimSpace(r.PostFormValue("reason")))
	if err != nil {
		back(w, r, Prefix+"deadletters/"+strconv.FormatInt(id, 10), "discard failed: "+err.Error())
		return
	}
	c.log.Info("console: dead letter discarded", "id", id, "job_id", job, "remote", r.RemoteAddr)
	back(w, r, Prefix+"deadletters", fmt.Sprintf("discarded dead letter %d of job %s: kept in its history, no longer open", id, job))
}

func (c *Console) requeueSet(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		back(w, r, Prefix+"deadletters", "requeue failed: "+err.Error())
		return
	}
	ids, err := jobctl.ParseIDs(r.PostForm["id"])
	switch {
	case err != nil:
	case len(ids) == 0:
		err = fmt.Errorf("tick the letters to requeue first")
	default:
		_, err = jobctl.Requeue(r.Context(), c.cfg.Pool, ids, c.actor(r))
	}
	to := Prefix + "deadletters"
	if k := r.PostFormValue("kind"); k != "" {
		to += "?kind=" + url.QueryEscape(k)
	}
	if err != nil {
		back(w, r, to, "requeue failed: "+err.Error())
		return
	}
	c.log.Info("console: dead letters requeued", "ids", ids, "remote", r.RemoteAddr)
	back(w, r, to, fmt.Sprintf("requeued %d chosen dead letter(s) through the outbox, identities kept", len(ids)))
}

func (c *Console) pauseKind(w http.ResponseWriter, r *http.Request) {
	kind, action := r.PathValue("kind"), r.PathValue("action")
	var msg string
	var err error
	switch action {
	case "pause":
		var changed bool
		var p pause.Paused
		p, changed, err = pause.Pause(r.Context(), c.cfg.Pool, kind, c.actor(r), strings.TrimSpace(r.PostFormValue("reason")))
		msg = fmt.Sprintf("paused %s: every host leaves its deliveries waiting in the stream within a second", kind)
		if err == nil && !changed {
			msg = fmt.Sprintf("%s is paused already, since %s by %s", kind, p.PausedAt.UTC().Format(time.RFC3339), p.PausedBy)
		}
	case "resume":
		var changed bool
		changed, err = pause.Resume(r.Context(), c.cfg.Pool, kind, c.actor(r))
		msg = fmt.Sprintf("resumed %s: its waiting deliveries run on every host within seconds", kind)
		if err == nil && !changed {
			msg = kind + " was not paused"
		}
	default:
		http.Error(w, "no such action: "+action, http.StatusNotFound)
		return
	}
	if err != nil {
		msg = action + " failed: " + err.Error()
	}
	c.log.Info("console: kind "+action, "kind", kind, "remote", r.RemoteAddr, "err", err)
	back(w, r, Prefix+"plugins", msg)
}

func (c *Console) rollback(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	// A rollback, once asked for, completes even if the browser goes away.
	ctx := context.WithoutCancel(r.Context())
	res, err := c.cfg.Rollback(ctx, name)
	msg := fmt.Sprintf("%s: %s (%s → %s)", res.Plugin, res.Action, res.From, res.To)
	if res.Error != "" {
		msg += ": " + res.Error
	}
	if err == nil {
		err = jobctl.Record(ctx, c.cfg.Pool, c.actor(r), jobctl.ActionRollback, name, fmt.Sprintf("%s → %s", res.From, res.To))
	}
	if err != nil {
		msg = "rollback failed: " + err.Error()
	}
	c.log.Info("console: plugin rollback", "plugin", name, "remote", r.RemoteAddr, "err", err)
	back(w, r, Prefix+"plugins", msg)
}

package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/usherhq/usher/host/history"
)

// payloadCap is how much of a payload the job's page shows; the whole
// value is a download away.
const payloadCap = 4 << 10

// payloadView is a job's payload as its page shows it: Shown is the
// value pretty-printed, cut at payloadCap bytes when Cut (the template
// escapes it); Gone says why there is none.
type payloadView struct {
	From        string
	Bytes       int
	Shown       string
	Cut         bool
	Gone        string
	DownloadURL string
}

func viewPayload(jobID string, p *history.Payload) *payloadView {
	if p == nil {
		return nil
	}
	v := &payloadView{From: p.From, Bytes: p.Bytes, Gone: p.Gone}
	if p.Gone != "" {
		return v
	}
	text := p.Text
	if len(p.Value) > 0 {
		var b bytes.Buffer
		if json.Indent(&b, p.Value, "", "  ") == nil {
			text = b.String()
		} else {
			text = string(p.Value)
		}
	}
	if len(text) > payloadCap {
		cut := payloadCap
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text, v.Cut = text[:cut], true
	}
	v.Shown = text
	v.DownloadURL = Prefix + "jobs/" + url.PathEscape(jobID) + "/payload"
	return v
}

// payloadFile names a download: the job id's safe characters only.
func payloadFile(jobID string) string {
	safe := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, jobID)
	if len(safe) > 64 {
		safe = safe[:64]
	}
	return "job-" + safe + "-payload.json"
}

// payload serves a job's whole payload as a download: its JSON as stored
// (a dead letter's bytes that are not JSON, as a JSON string of their
// text). A payload no longer kept is a 404 that says so.
func (c *Console) payload(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, err := history.GetPayload(r.Context(), c.cfg.Pool, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if p.Gone != "" {
		http.Error(w, fmt.Sprintf("job %s's payload is %s", id, p.Gone), http.StatusNotFound)
		return
	}
	body := []byte(p.Value)
	if len(body) == 0 {
		if body, err = json.Marshal(p.Text); err != nil {
			c.fail(w, r, errors.New("console: payload: "+err.Error()))
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", `attachment; filename="`+payloadFile(id)+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(body)
}

package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// cookieName is the console's session cookie.
const cookieName = "usher_console"

// sessions are the logged-in browsers, by cookie value.
type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	now func() time.Time
	by  map[string]session
}

// session is one logged-in browser: when it expires, and the name its
// operator gave at login ("" if none).
type session struct {
	expires time.Time
	name    string
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, by: map[string]session{}}
}

func (s *sessions) create(name string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	id := hex.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, ss := range s.by { // forget expired ones, so the map stays small
		if now.After(ss.expires) {
			delete(s.by, k)
		}
	}
	s.by[id] = session{expires: now.Add(s.ttl), name: name}
	return id
}

// get is the session id names, if it is valid.
func (s *sessions) get(id string) (session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.by[id]
	return ss, ok && s.now().Before(ss.expires)
}

func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.by, id)
}

// tokenOK compares tok with the admin token in constant time.
func (c *Console) tokenOK(tok string) bool {
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(sum[:], c.tokenSum[:]) == 1
}

// bearer reports whether r carries the admin token as the API takes it.
func (c *Console) bearer(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && c.tokenOK(tok)
}

func (c *Console) session(r *http.Request) (string, bool) {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return "", false
	}
	_, ok := c.sessions.get(ck.Value)
	return ck.Value, ok
}

// defaultOperator is who acts in the console when no name was given at
// login or on the form.
const defaultOperator = "operator"

// actor is who acts in the console, as operator_actions records it (and
// kind_pauses' paused_by): the name given on the action's form (by=), else
// the one given at login, else "operator", and the caller's address, as
// the admin API records "NAME via the admin API from ADDR".
func (c *Console) actor(r *http.Request) string {
	name := strings.TrimSpace(r.PostFormValue("by"))
	if name == "" {
		if ck, err := r.Cookie(cookieName); err == nil {
			ss, _ := c.sessions.get(ck.Value)
			name = ss.name
		}
	}
	if name == "" {
		name = defaultOperator
	}
	return fmt.Sprintf("%.200s via the console from %s", name, r.RemoteAddr)
}

// sameOriginPost reports whether a POST shows it comes from the console's
// own pages (see the package comment). The admin guard has already refused
// an Origin other than the listener's own.
func sameOriginPost(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		return err == nil && strings.EqualFold(u.Host, r.Host)
	}
	return r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

// authed wraps a page: a request without a session or the token is sent to
// the login form (a GET) or refused (anything else); a POST must also pass
// sameOriginPost unless it carries the token.
func (c *Console) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, ok := c.session(r)
		bearer := !ok && c.bearer(r)
		if !ok && !bearer {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "console: log in first", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost && !bearer && !sameOriginPost(r) {
			c.log.Warn("console: POST refused: no same-origin Origin", "path", r.URL.Path, "remote", r.RemoteAddr)
			http.Error(w, "console: this action must come from the console's own page", http.StatusForbidden)
			return
		}
		next(w, r)
	}
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "login.html", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !sameOriginPost(r) {
		http.Error(w, "console: log in from the console's own page", http.StatusForbidden)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	if !c.tokenOK(r.PostFormValue("token")) {
		c.log.Warn("console: login refused: wrong token", "remote", r.RemoteAddr)
		c.renderStatus(w, r, http.StatusUnauthorized, "login.html", map[string]any{"Next": next, "Error": "That is not this host's admin token."})
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: c.sessions.create(name), Path: Prefix,
		MaxAge: int(c.cfg.SessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	c.log.Info("console: logged in", "name", name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if id, ok := c.session(r); ok {
		c.sessions.end(id)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext keeps a redirect after login inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return Prefix
	}
	return next
}

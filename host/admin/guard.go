package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// GuardConfig configures Guard.
type GuardConfig struct {
	// Token is the bearer token every endpoint but OpenPaths requires.
	// Required.
	Token string
	// ListenAddr is the listener's address as configured (host:port; the
	// host part may be a name) and BoundAddr the address it is bound to
	// (its net.Addr); a Host header naming either's host is allowed.
	ListenAddr, BoundAddr string
	// AllowedHosts are further names clients may use in Host (and so in
	// Origin): "name" allows it with any port, "name:port" only with that
	// port. For a host reached by a DNS name or behind a proxy. Optional.
	AllowedHosts []string
	// OpenPaths need no token (still Host- and Origin-checked). Default
	// none.
	OpenPaths []string
	// SelfAuthPrefixes are path prefixes ("/console/") whose handler
	// authenticates the request itself (the console's session cookie or
	// the bearer token); still Host- and Origin-checked. The path is
	// cleaned before it is compared. Default none.
	SelfAuthPrefixes []string
	// Logger logs refused requests (never the token). Required.
	Logger *slog.Logger
}

// Guard wraps next with the Host, Origin and token checks described in the
// package comment.
func Guard(cfg GuardConfig, next http.Handler) (http.Handler, error) {
	if err := CheckToken(cfg.Token); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		return nil, fmt.Errorf("admin: Logger is required")
	}
	g := &guard{next: next, log: cfg.Logger, names: map[string]bool{}, hostPorts: map[string]bool{},
		open: map[string]bool{}, selfAuth: cfg.SelfAuthPrefixes}
	sum := sha256.Sum256([]byte(cfg.Token))
	g.tokenSum = sum[:]
	for _, n := range []string{"localhost", "127.0.0.1", "::1"} {
		g.names[n] = true
	}
	for _, a := range []string{cfg.ListenAddr, cfg.BoundAddr} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
			if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
				g.names[normHost(h)] = true
			}
		}
	}
	for _, a := range cfg.AllowedHosts {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if h, p, err := net.SplitHostPort(a); err == nil {
			g.hostPorts[net.JoinHostPort(normHost(h), p)] = true
		} else {
			g.names[normHost(strings.Trim(a, "[]"))] = true
		}
	}
	for _, p := range cfg.OpenPaths {
		g.open[p] = true
	}
	return g, nil
}

type guard struct {
	next      http.Handler
	log       *slog.Logger
	tokenSum  []byte
	names     map[string]bool // allowed with any port
	hostPorts map[string]bool // allowed with this port only
	open      map[string]bool
	selfAuth  []string
}

// authenticatesItself reports whether p is under one of SelfAuthPrefixes
// (or is the prefix without its trailing slash).
func (g *guard) authenticatesItself(p string) bool {
	p = path.Clean("/" + p)
	for _, pre := range g.selfAuth {
		if p == strings.TrimSuffix(pre, "/") || strings.HasPrefix(p, pre) {
			return true
		}
	}
	return false
}

func normHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// allowed reports whether hostport (a Host header or an Origin's host)
// names this listener or an allowed name.
func (g *guard) allowed(hostport string) bool {
	if hostport == "" {
		return false
	}
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port: a bare name or IP (a bracketed IPv6 literal without
		// port keeps its brackets).
		h, p = strings.Trim(hostport, "[]"), ""
	}
	h = normHost(h)
	if g.names[h] {
		return true
	}
	return p != "" && g.hostPorts[net.JoinHostPort(h, p)]
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.allowed(r.Host) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf(
			"admin API: Host %q is not this listener's; use its address, localhost, 127.0.0.1 or [::1], or add the name to the host's allowed admin hosts\n", r.Host))
		return
	}
	if o := r.Header.Get("Origin"); o != "" && !g.sameOrigin(o, r.Host) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf(
			"admin API: requests from origin %q are refused: the admin API answers only its own origin\n", o))
		return
	}
	if !g.open[r.URL.Path] && !g.authenticatesItself(r.URL.Path) {
		if msg := g.checkToken(r); msg != "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="usher admin"`)
			if r.Header.Get("Authorization") != "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="usher admin", error="invalid_token"`)
			}
			g.refuse(w, r, http.StatusUnauthorized, msg)
			return
		}
	}
	g.next.ServeHTTP(w, r)
}

// sameOrigin reports whether origin is http(s)://<host> with host the
// request's (allowed) Host, default ports folded.
func (g *guard) sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false // includes "null" (sandboxed frames, file: pages)
	}
	if !g.allowed(u.Host) {
		return false
	}
	return foldPort(u.Scheme, u.Host) == foldPort("http", host) || foldPort(u.Scheme, u.Host) == foldPort("https", host)
}

// foldPort lowercases hostport and drops the scheme's default port.
func foldPort(scheme, hostport string) string {
	hostport = strings.ToLower(hostport)
	def := map[string]string{"http": ":80", "https": ":443"}[scheme]
	return strings.TrimSuffix(hostport, def)
}

// checkToken returns why the request's token is refused, or "".
func (g *guard) checkToken(r *http.Request) string {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return "admin API: this endpoint requires the host's admin token: Authorization: Bearer <token>\n"
	}
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "admin API: the Authorization header must be Bearer <token>\n"
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	if subtle.ConstantTimeCompare(sum[:], g.tokenSum) != 1 {
		return "admin API: wrong admin token\n"
	}
	return ""
}

func (g *guard) refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	g.log.Warn("admin request refused", "status", code, "method", r.Method, "path", r.URL.Path,
		"host", r.Host, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg))
}

// IsLoopback reports whether addr (a bound net.Addr's string) is a
// loopback address.
func IsLoopback(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

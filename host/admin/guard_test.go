package admin_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/admin"
)

// A path under SelfAuthPrefixes reaches its handler without the token but
// still Host- and Origin-checked; a path that only looks like one (dot
// segments, a longer name) still needs the token.
func TestGuardSelfAuthPrefixes(t *testing.T) {
	t.Parallel()
	reached := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	g, err := admin.Guard(admin.GuardConfig{Token: "0123456789abcdef0123", ListenAddr: "127.0.0.1:9464", BoundAddr: "127.0.0.1:9464",
		SelfAuthPrefixes: []string{"/console/"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, reached)
	require.NoError(t, err)
	for _, c := range []struct {
		path, host, origin string
		want               int
	}{
		{"/console/", "127.0.0.1:9464", "", http.StatusTeapot},
		{"/console", "127.0.0.1:9464", "", http.StatusTeapot},
		{"/console/deadletters/1/requeue", "localhost:9464", "http://localhost:9464", http.StatusTeapot},
		{"/console/../plugins", "127.0.0.1:9464", "", http.StatusUnauthorized},
		{"/console/./../metrics", "127.0.0.1:9464", "", http.StatusUnauthorized},
		{"/consoles", "127.0.0.1:9464", "", http.StatusUnauthorized},
		{"/plugins", "127.0.0.1:9464", "", http.StatusUnauthorized},
		{"/console/", "attacker.example", "", http.StatusForbidden},
		{"/console/plugins/reload", "127.0.0.1:9464", "http://127.0.0.1:9465", http.StatusForbidden},
	} {
		req := httptest.NewRequest("GET", "http://127.0.0.1:9464/", nil)
		req.URL.Path, req.Host = c.path, c.host
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		require.Equal(t, c.want, rec.Code, "%s (Host %s, Origin %s)", c.path, c.host, c.origin)
	}
}

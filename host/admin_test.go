package host_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/hosttest"
)

// adminCall is one request to a running host's admin API.
type adminCall struct {
	method, path string
	host         string // Host header; default the listener's address
	origin       string
	token        string
}

func (c adminCall) do(t *testing.T, addr string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, "http://"+addr+c.path, nil)
	require.NoError(t, err)
	if c.host != "" {
		req.Host = c.host
	}
	if c.origin != "" {
		req.Header.Set("Origin", c.origin)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// The admin API refuses a request without the token, with a wrong one,
// from a foreign Host (DNS rebinding) or a foreign Origin (a web page),
// and serves the operator's; /healthz needs no token but is Host-checked.
func TestAdminAPIAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	cfg := b.dirConfig(d)
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.AdminAllowedHosts = []string{"usher-admin.internal", "proxy.internal:8443"}
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	addr, tok := h.AdminAddr(), h.AdminToken
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)

	for _, path := range []string{"/plugins", "/metrics"} {
		code, hdr, body := adminCall{method: "GET", path: path}.do(t, addr)
		require.Equal(t, http.StatusUnauthorized, code, path)
		require.Equal(t, `Bearer realm="usher admin"`, hdr.Get("WWW-Authenticate"))
		require.Contains(t, body, "requires the host's admin token")

		code, hdr, body = adminCall{method: "GET", path: path, token: strings.Repeat("0", 64)}.do(t, addr)
		require.Equal(t, http.StatusUnauthorized, code, path)
		require.Contains(t, hdr.Get("WWW-Authenticate"), `error="invalid_token"`)
		require.Contains(t, body, "wrong admin token")

		code, _, body = adminCall{method: "GET", path: path, token: tok}.do(t, addr)
		require.Equal(t, http.StatusOK, code, path)
		require.NotEmpty(t, body)
	}
	code, _, _ := adminCall{method: "POST", path: "/plugins/reload"}.do(t, addr)
	require.Equal(t, http.StatusUnauthorized, code)

	// Names the listener answers to, with the token.
	for _, name := range []string{addr, "localhost:" + port, "127.0.0.1", "[::1]:" + port, "LOCALHOST:" + port,
		"usher-admin.internal:" + port, "usher-admin.internal", "proxy.internal:8443"} {
		code, _, body := adminCall{method: "GET", path: "/plugins", host: name, token: tok}.do(t, addr)
		require.Equal(t, http.StatusOK, code, "Host %s: %s", name, body)
	}
	// DNS rebinding: a foreign name, with or without the right token.
	for _, name := range []string{"evil.example:" + port, "evil.example", "proxy.internal:80", "localhost.evil.example:" + port} {
		code, _, body := adminCall{method: "GET", path: "/plugins", host: name, token: tok}.do(t, addr)
		require.Equal(t, http.StatusForbidden, code, "Host %s", name)
		require.Contains(t, body, "is not this listener's")
	}

	// /healthz: open, but Host- and Origin-checked.
	code, _, body := adminCall{method: "GET", path: "/healthz"}.do(t, addr)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, _, _ = adminCall{method: "GET", path: "/healthz", host: "evil.example:" + port}.do(t, addr)
	require.Equal(t, http.StatusForbidden, code)
	code, _, _ = adminCall{method: "GET", path: "/healthz", origin: "http://evil.example"}.do(t, addr)
	require.Equal(t, http.StatusForbidden, code)

	// A web page's POST carries its Origin: refused with the right token,
	// and nothing is reloaded.
	d.install(hosttest.Build(t, "./plugins/counters", "main.version=2.0.0"), "counters", "counters", "2.0.0")
	for _, origin := range []string{"http://evil.example", "null", "http://localhost:3000", "https://usher-admin.internal"} {
		code, _, body := adminCall{method: "POST", path: "/plugins/reload", origin: origin, token: tok}.do(t, addr)
		require.Equal(t, http.StatusForbidden, code, origin)
		require.Contains(t, body, "answers only its own origin")
	}
	require.Equal(t, "1.0.0", pluginStatus(t, h, "counters").Version, "no reload ran")
	code, _, _ = adminCall{method: "GET", path: "/plugins/reload", token: tok}.do(t, addr)
	require.Equal(t, http.StatusMethodNotAllowed, code)

	// Its own origin is allowed (a browser on the admin address itself).
	code, _, body = adminCall{method: "POST", path: "/plugins/reload", origin: "http://" + addr, token: tok}.do(t, addr)
	require.Equal(t, http.StatusOK, code, body)
	var out host.ReloadResponse
	require.NoError(t, json.Unmarshal([]byte(body), &out))
	require.Equal(t, []host.ReloadResult{{Plugin: "counters", Action: "swapped", From: "1.0.0", To: "2.0.0",
		StartTime: out.Results[0].StartTime, DrainTime: out.Results[0].DrainTime, Drained: true}}, out.Results)
}

// The token file is created 0600 (directory 0700) on first start and the
// same token is used on the next; the token given in the configuration
// wins over the file.
func TestAdminTokenFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	file := filepath.Join(t.TempDir(), "state", "usher", "admin-token")
	cfg := b.config()
	cfg.AdminAddr, cfg.AdminTokenFile = "127.0.0.1:0", file
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))

	h := hosttest.Start(t, cfg)
	st, err := os.Stat(file)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	dst, err := os.Stat(filepath.Dir(file))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dst.Mode().Perm())
	first := h.AdminToken
	require.Len(t, first, 64)
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, first+"\n", string(raw))
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	code, _, _ := adminCall{method: "GET", path: "/plugins", token: first}.do(t, h.AdminAddr())
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, h.Stop())

	h = hosttest.Start(t, cfg)
	require.Equal(t, first, h.AdminToken, "the second start reuses the file")
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	code, _, _ = adminCall{method: "GET", path: "/plugins", token: first}.do(t, h.AdminAddr())
	require.Equal(t, http.StatusOK, code)
	code, _, _ = adminCall{method: "GET", path: "/plugins", token: first[:63] + "x"}.do(t, h.AdminAddr())
	require.Equal(t, http.StatusUnauthorized, code)
	require.NoError(t, h.Stop())
	require.Contains(t, logs.String(), `msg="admin token created" file=`+file)
	require.Contains(t, logs.String(), `msg="admin token read" file=`+file)
	require.Contains(t, logs.String(), `msg="admin request refused" status=401`)
	require.NotContains(t, logs.String(), first, "the token is never logged")
	require.NotContains(t, logs.String(), "non-loopback", "127.0.0.1 is a loopback address")

	cfg.AdminToken = "configured-token-0123456789"
	h = hosttest.Start(t, cfg)
	require.Contains(t, logs.String(), "admin_token=xxxxx", "the configuration is printed with the token masked")
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	code, _, _ = adminCall{method: "GET", path: "/plugins", token: first}.do(t, h.AdminAddr())
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = adminCall{method: "GET", path: "/plugins", token: cfg.AdminToken}.do(t, h.AdminAddr())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, logs.String(), cfg.AdminToken)
}

// An admin address that is not a loopback one is served with a warning.
func TestAdminNonLoopbackWarns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.AdminAddr = "0.0.0.0:0"
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	require.Contains(t, logs.String(), "level=WARN msg=\"the admin API listens on a non-loopback address: its token is the only protection")
	require.Contains(t, logs.String(), "terminate TLS in front of it")
	// Bound to every address, it answers to the loopback names only.
	_, port, err := net.SplitHostPort(h.AdminAddr())
	require.NoError(t, err)
	code, _, _ := adminCall{method: "GET", path: "/plugins", token: h.AdminToken}.do(t, "127.0.0.1:"+port)
	require.Equal(t, http.StatusOK, code)
	code, _, _ = adminCall{method: "GET", path: "/plugins", host: "0.0.0.0:" + port, token: h.AdminToken}.do(t, "127.0.0.1:"+port)
	require.Equal(t, http.StatusForbidden, code)
}

// A token file group or others may read is refused, naming the file and
// its mode; so is a token too short to be one.
func TestAdminTokenFileRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	file := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(file, []byte(strings.Repeat("a", 64)+"\n"), 0o600))
	require.NoError(t, os.Chmod(file, 0o640))
	cfg := b.config()
	cfg.AdminAddr, cfg.AdminTokenFile = "127.0.0.1:0", file
	_, err := host.New(context.Background(), cfg)
	require.ErrorContains(t, err, "admin token file "+file+" has mode 0640: group or others may read it")

	require.NoError(t, os.Chmod(file, 0o600))
	require.NoError(t, os.WriteFile(file, []byte("short\n"), 0o600))
	_, err = host.New(context.Background(), cfg)
	require.ErrorContains(t, err, "fewer than 16")

	cfg.AdminToken = "short"
	_, err = host.New(context.Background(), cfg)
	require.ErrorContains(t, err, "AdminToken: the admin token has 5 characters")
}

// Hosts starting at once on one missing token file agree on one token.
func TestAdminTokenFileConcurrentCreate(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "usher", "admin-token")
	const n = 8
	toks := make([]string, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks[i], created[i], errs[i] = admin.LoadOrCreateTokenFile(file)
		}()
	}
	wg.Wait()
	writers := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, toks[0], toks[i])
		if created[i] {
			writers++
		}
	}
	require.Equal(t, 1, writers)
	left, err := filepath.Glob(filepath.Join(filepath.Dir(file), ".admin-token-*"))
	require.NoError(t, err)
	require.Empty(t, left, "no temporary file left behind")
}

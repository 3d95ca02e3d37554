package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const ticketBody = `{"to":"ada@example.com","subject":"Your tickets","text":"See attached.","attachments":[{"name":"tickets-4471.pdf","sha256":"abc"}]}`

// provider is a Server behind an httptest.Server.
type provider struct {
	t   *testing.T
	srv *Server
	ts  *httptest.Server
}

func startProvider(t *testing.T, dir string, opts Options) *provider {
	t.Helper()
	srv, err := NewServer(dir, opts)
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	p := &provider{t: t, srv: srv, ts: ts}
	t.Cleanup(p.stop)
	return p
}

// stop closes the HTTP server (waiting for in-flight handlers) and the store.
func (p *provider) stop() {
	p.ts.Close()
	require.NoError(p.t, p.srv.Close())
}

type reply struct {
	status   int
	body     string
	replayed bool
}

func (p *provider) do(ctx context.Context, method, path, key, body string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, p.ts.URL+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.ts.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

func (p *provider) send(key, body string) reply {
	p.t.Helper()
	r, err := p.do(context.Background(), http.MethodPost, "/v1/messages", key, body)
	require.NoError(p.t, err)
	return r
}

func (p *provider) setFaults(plan string) {
	p.t.Helper()
	r, err := p.do(context.Background(), http.MethodPost, "/_admin/faults", "", plan)
	require.NoError(p.t, err)
	require.Equal(p.t, http.StatusOK, r.status, r.body)
}

func (p *provider) messages() messagesResponse {
	p.t.Helper()
	r, err := p.do(context.Background(), http.MethodGet, "/_admin/messages", "", "")
	require.NoError(p.t, err)
	require.Equal(p.t, http.StatusOK, r.status)
	var m messagesResponse
	require.NoError(p.t, json.Unmarshal([]byte(r.body), &m))
	return m
}

func (p *provider) stats() statsResponse {
	p.t.Helper()
	r, err := p.do(context.Background(), http.MethodGet, "/_admin/stats", "", "")
	require.NoError(p.t, err)
	require.Equal(p.t, http.StatusOK, r.status)
	var s statsResponse
	require.NoError(p.t, json.Unmarshal([]byte(r.body), &s))
	return s
}

func messageID(t *testing.T, body string) string {
	t.Helper()
	var r sendResponse
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	require.True(t, strings.HasPrefix(r.ID, "msg_"), "id %q", r.ID)
	require.Equal(t, "queued", r.Status)
	return r.ID
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestNewKeySendsOnce(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})

	r := p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status, r.body)
	require.False(t, r.replayed)
	id := messageID(t, r.body)

	m := p.messages()
	require.Equal(t, 1, m.Count)
	require.Len(t, m.Messages, 1)
	got := m.Messages[0]
	require.Equal(t, id, got.ID)
	require.Equal(t, "tickets-4471", got.IdempotencyKey)
	require.Equal(t, sha(ticketBody), got.BodySHA256)
	require.Equal(t, "ada@example.com", got.To)
	require.Equal(t, "Your tickets", got.Subject)
	require.False(t, got.SentAt.IsZero())
	require.Equal(t, statsResponse{Sent: 1}, p.stats())
}

func TestReplayReturnsFirstResponse(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})

	first := p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, first.status)
	second := p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, second.status)
	require.True(t, second.replayed, "a replay carries Idempotent-Replayed: true")
	require.JSONEq(t, first.body, second.body)
	require.Equal(t, messageID(t, first.body), messageID(t, second.body))

	require.Equal(t, 1, p.messages().Count)
	require.Equal(t, statsResponse{Sent: 1, Replayed: 1}, p.stats())
}

func TestDifferentBodyIs422NamingTheKey(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})

	require.Equal(t, http.StatusAccepted, p.send("tickets-4471", ticketBody).status)
	r := p.send("tickets-4471", `{"to":"ada@example.com","subject":"Other"}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	require.JSONEq(t, `{"error":"idempotency key tickets-4471 was already used with a different request body"}`, r.body)
	require.False(t, r.replayed)

	require.Equal(t, 1, p.messages().Count)
	require.Equal(t, statsResponse{Sent: 1, Conflicts: 1}, p.stats())
}

func TestMissingKeyIs400(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})

	r := p.send("", ticketBody)
	require.Equal(t, http.StatusBadRequest, r.status)
	require.JSONEq(t, `{"error":"missing Idempotency-Key header"}`, r.body)
	require.Zero(t, p.messages().Count)
}

func TestBadBodies(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})

	for _, body := range []string{``, `null`, `[1,2]`, `"text"`, `{"to":`} {
		r := p.send("k-"+body, body)
		require.Equal(t, http.StatusBadRequest, r.status, "body %q", body)
		require.JSONEq(t, `{"error":"request body must be a JSON object"}`, r.body)
	}

	big := `{"text":"` + strings.Repeat("x", maxBodyBytes) + `"}`
	r := p.send("big", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	require.Contains(t, r.body, "larger than the limit of 1048576 bytes")

	r = p.send(strings.Repeat("k", maxKeyBytes+1), ticketBody)
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Zero(t, p.messages().Count)
}

func TestConcurrentSameKeySendsOnce(t *testing.T) {
	t.Parallel()
	// The first request to find the key new holds on until all n requests
	// are inside the handler (holding or waiting for the key), so they
	// really overlap the check-then-send window.
	const n = 50
	var overlapped atomic.Bool
	p := startProvider(t, t.TempDir(), Options{beforeSend: func(s *Server, key string) {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if s.locks.holders(key) == n {
				overlapped.Store(true)
				return
			}
			runtime.Gosched()
		}
	}})
	replies := make([]reply, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = p.do(context.Background(), http.MethodPost, "/v1/messages", "tickets-4471", ticketBody)
		})
	}
	close(start)
	wg.Wait()

	fresh := 0
	ids := map[string]bool{}
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, http.StatusAccepted, replies[i].status, replies[i].body)
		ids[messageID(t, replies[i].body)] = true
		if !replies[i].replayed {
			fresh++
		}
	}
	require.True(t, overlapped.Load(), "all requests were in flight together")
	require.Len(t, ids, 1, "every request sees the same message id")
	require.Equal(t, 1, fresh, "exactly one request sent, the others replayed")
	require.Equal(t, 1, p.messages().Count)
	require.Equal(t, statsResponse{Sent: 1, Replayed: n - 1}, p.stats())
}

func TestFailNextThenRetrySendsOnce(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})
	p.setFaults(`{"fail_next":1,"fail_status":503}`)

	r := p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Contains(t, r.body, "nothing was sent")
	require.Zero(t, p.messages().Count, "an injected failure sends nothing")

	r = p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status, r.body)
	require.False(t, r.replayed, "the key was not recorded by the failed attempt")
	require.Equal(t, 1, p.messages().Count)
	require.Equal(t, statsResponse{Sent: 1, FailedInjected: 1}, p.stats())
}

func TestFailAfterSendThenRetryReplays(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})
	p.setFaults(`{"fail_after_send_next":1}`)

	r := p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusInternalServerError, r.status)
	m := p.messages()
	require.Equal(t, 1, m.Count, "the message left although the client saw an error")

	r = p.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status, r.body)
	require.True(t, r.replayed)
	require.Equal(t, m.Messages[0].ID, messageID(t, r.body))
	require.Equal(t, 1, p.messages().Count)
	require.Equal(t, statsResponse{Sent: 1, Replayed: 1, FailedInjected: 1}, p.stats())
}

func TestDelayHeedsClientGivingUp(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})

	// A client that gives up during the delay leaves nothing behind.
	p.setFaults(`{"delay_next":1,"delay_ms":60000}`)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := p.do(ctx, http.MethodPost, "/v1/messages", "tickets-4471", ticketBody)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// A delay that the client waits out ends in a normal send.
	p.setFaults(`{"delay_next":1,"delay_ms":50}`)
	began := time.Now()
	r := p.send("tickets-4472", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status)
	require.GreaterOrEqual(t, time.Since(began), 50*time.Millisecond)

	// Close waits for every handler, the abandoned one included: had it
	// gone on after its 60 s delay, this would hang and count 2.
	p.stop()
	msgs := p.srv.store.messages()
	require.Len(t, msgs, 1)
	require.Equal(t, "tickets-4472", msgs[0].IdempotencyKey)
}

func TestFailRateIsSeeded(t *testing.T) {
	t.Parallel()
	always := startProvider(t, t.TempDir(), Options{FailRate: 1, Seed: 7})
	r := always.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Zero(t, always.messages().Count)

	outcomes := func(seed uint64) []int {
		p := startProvider(t, t.TempDir(), Options{FailRate: 0.5, Seed: seed})
		var got []int
		for i := range 40 {
			got = append(got, p.send("k"+strings.Repeat("x", i), ticketBody).status)
		}
		return got
	}
	a, b := outcomes(42), outcomes(42)
	require.Equal(t, a, b, "the same seed gives the same faults")
	require.Contains(t, a, http.StatusServiceUnavailable)
	require.Contains(t, a, http.StatusAccepted)

	_, err := NewServer(t.TempDir(), Options{FailRate: 1.5})
	require.Error(t, err)
}

func TestFaultPlanValidation(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})
	for _, plan := range []string{
		`{"fail_next":1,"fail_status":200}`,
		`{"fail_next":-1}`,
		`{"fail_nxt":1}`,
		`{"delay_next":1,"delay_ms":600001}`,
		`not json`,
	} {
		r, err := p.do(context.Background(), http.MethodPost, "/_admin/faults", "", plan)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, r.status, "plan %s", plan)
	}
	p.setFaults(`{"fail_next":2}`)
	r, err := p.do(context.Background(), http.MethodGet, "/_admin/faults", "", "")
	require.NoError(t, err)
	require.JSONEq(t, `{"fail_next":2,"fail_status":503,"delay_next":0,"delay_ms":0,"fail_after_send_next":0}`, r.body)
}

func TestHealthzAndRouting(t *testing.T) {
	t.Parallel()
	p := startProvider(t, t.TempDir(), Options{})
	r, err := p.do(context.Background(), http.MethodGet, "/healthz", "", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "ok", r.body)

	r, err = p.do(context.Background(), http.MethodGet, "/v1/messages", "k", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
}

func TestRestartKeepsKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	first := startProvider(t, dir, Options{})
	r := first.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status)
	id := messageID(t, r.body)
	first.stop()

	second := startProvider(t, dir, Options{})
	r = second.send("tickets-4471", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status)
	require.True(t, r.replayed, "the key survived the restart")
	require.Equal(t, id, messageID(t, r.body))
	require.Equal(t, http.StatusUnprocessableEntity, second.send("tickets-4471", `{"to":"x"}`).status)
	m := second.messages()
	require.Equal(t, 1, m.Count, "the replay after the restart sent nothing")
	require.Equal(t, id, m.Messages[0].ID)
	require.Equal(t, statsResponse{Sent: 1, Replayed: 1, Conflicts: 1}, second.stats())
}

func TestTornLastLineIsDropped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := startProvider(t, dir, Options{})
	require.Equal(t, http.StatusAccepted, first.send("tickets-4471", ticketBody).status)
	first.stop()

	// A crash in the middle of writing the next record.
	path := filepath.Join(dir, logFileName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"key":"tickets-4472","body_sha`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	second := startProvider(t, dir, Options{})
	require.Equal(t, 1, second.messages().Count)
	r := second.send("tickets-4472", ticketBody)
	require.Equal(t, http.StatusAccepted, r.status)
	require.False(t, r.replayed, "the torn record never answered, so it is not a key")
	second.stop()

	third := startProvider(t, dir, Options{})
	require.Equal(t, 2, third.messages().Count, "the append after the repair is readable")
}

func TestCorruptMiddleLineIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := startProvider(t, dir, Options{})
	require.Equal(t, http.StatusAccepted, first.send("tickets-4471", ticketBody).status)
	first.stop()

	path := filepath.Join(dir, logFileName)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append([]byte("garbage\n"), data...), 0o644))

	_, err = NewServer(dir, Options{})
	require.ErrorContains(t, err, "line 1 is corrupt")
}

func TestDataDirIsExclusive(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("no flock")
	}
	dir := t.TempDir()
	startProvider(t, dir, Options{})
	_, err := NewServer(dir, Options{})
	require.ErrorContains(t, err, "in use by another mailprovider")
}

package mail

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/sdk"
)

var ticketMail = Message{
	To:      "ada@example.com",
	Subject: "Your tickets for order 4471",
	Text:    "Two tickets are attached.",
	Attachments: []Attachment{
		{Name: "ticket-1.pdf", SHA256: strings.Repeat("a", 64)},
		{Name: "ticket-2.pdf", SHA256: strings.Repeat("b", 64)},
	},
}

// --- The real binary, built once and run as a separate process. ---

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// providerBinary builds cmd/mailprovider (once per test run) and returns its path.
func providerBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", "..", ".."))
		if err != nil {
			binErr = err
			return
		}
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
			binErr = fmt.Errorf("module root not found at %s: %w", root, err)
			return
		}
		gobin, err := exec.LookPath("go")
		if err != nil {
			binErr = fmt.Errorf("the go command is needed to build the provider: %w", err)
			return
		}
		if binDir, err = os.MkdirTemp("", "mailprovider-bin-"); err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(binDir, "mailprovider")
		cmd := exec.Command(gobin, "build", "-o", binPath, "./cmd/mailprovider")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/mailprovider: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

// providerProcess is one running mailprovider.
type providerProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's result, valid after exited is closed
	stderr *syncBuffer
	url    string
}

// startProvider runs the binary on dataDir with a free port and returns once
// it has announced its address (it listens before announcing). The process
// is killed at the end of the test.
func startProvider(t *testing.T, dataDir string) *providerProcess {
	t.Helper()
	out := newFirstLineWriter()
	p := &providerProcess{t: t, exited: make(chan struct{}), stderr: &syncBuffer{}}
	p.cmd = exec.Command(providerBinary(t), "-addr", "127.0.0.1:0", "-data", dataDir)
	p.cmd.Stdout = out
	p.cmd.Stderr = p.stderr
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("mailprovider stderr:\n%s", p.stderr.String())
		}
	})

	select {
	case line := <-out.line:
		const prefix = "mailprovider listening on "
		require.True(t, strings.HasPrefix(line, prefix), "unexpected first line %q", line)
		p.url = strings.TrimPrefix(line, prefix)
	case <-p.exited:
		t.Fatalf("mailprovider exited before announcing its address: %v\n%s", p.err, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("mailprovider did not announce its address within 30s\n%s", p.stderr.String())
	}
	return p
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone.
func (p *providerProcess) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// terminate sends SIGTERM and waits for a graceful exit.
func (p *providerProcess) terminate() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return p.err
	case <-time.After(30 * time.Second):
		return errors.New("mailprovider did not exit within 30s of SIGTERM")
	}
}

func (p *providerProcess) client() *Client {
	return &Client{BaseURL: p.url, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// firstLineWriter hands the first line written to it to line, and discards
// the rest.
type firstLineWriter struct {
	mu   sync.Mutex
	buf  []byte
	done bool
	line chan string
}

func newFirstLineWriter() *firstLineWriter { return &firstLineWriter{line: make(chan string, 1)} }

func (w *firstLineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.buf = append(w.buf, b...)
		if i := strings.IndexByte(string(w.buf), '\n'); i >= 0 {
			w.done = true
			w.line <- strings.TrimSpace(string(w.buf[:i]))
			w.buf = nil
		}
	}
	return len(b), nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(b)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestClientAgainstProviderProcess(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dataDir := t.TempDir()
	key := sdk.KeyForTest("tickets-4471")

	p := startProvider(t, dataDir)
	c := p.client()

	first, err := c.Send(ctx, key, ticketMail)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first.ID, "msg_"), first.ID)
	require.False(t, first.Replayed)

	again, err := c.Send(ctx, key, ticketMail)
	require.NoError(t, err)
	require.Equal(t, Receipt{ID: first.ID, Replayed: true}, again)

	changed := ticketMail
	changed.Subject = "Your tickets (corrected)"
	_, err = c.Send(ctx, key, changed)
	require.ErrorIs(t, err, ErrRejected)
	var se *StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusUnprocessableEntity, se.StatusCode)
	require.Equal(t, "idempotency key tickets-4471 was already used with a different request body", se.Message)
	require.ErrorContains(t, err, "422")

	msgs, err := c.Messages(ctx)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	body, err := EncodeMessage(ticketMail)
	require.NoError(t, err)
	sum := sha256.Sum256(body)
	require.Equal(t, first.ID, msgs[0].ID)
	require.Equal(t, "tickets-4471", msgs[0].IdempotencyKey)
	require.Equal(t, hex.EncodeToString(sum[:]), msgs[0].BodySHA256)
	require.Equal(t, ticketMail.To, msgs[0].To)
	require.Equal(t, ticketMail.Subject, msgs[0].Subject)

	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Sent: 1, Replayed: 1, Conflicts: 1}, stats)

	// kill -9, then a new process on the same data directory.
	p.kill()
	require.Error(t, p.err, "the process died of SIGKILL")

	p2 := startProvider(t, dataDir)
	c2 := p2.client()
	afterCrash, err := c2.Send(ctx, key, ticketMail)
	require.NoError(t, err)
	require.Equal(t, Receipt{ID: first.ID, Replayed: true}, afterCrash, "the key survived kill -9")
	_, err = c2.Send(ctx, key, changed)
	require.ErrorIs(t, err, ErrRejected)

	msgs, err = c2.Messages(ctx)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "nothing was sent again after the restart")
	stats, err = c2.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Sent: 1, Replayed: 1, Conflicts: 1}, stats, "sent is durable; the rest counts since the restart")

	require.NoError(t, p2.terminate(), "SIGTERM is a graceful, successful exit")
}

func TestClientRetriesAfterProviderErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := startProvider(t, t.TempDir()).client()

	// A 503 before sending: not a rejection, and the retry sends.
	require.NoError(t, c.SetFaults(ctx, Faults{FailNext: 1}))
	key := sdk.KeyForTest("tickets-4471")
	_, err := c.Send(ctx, key, ticketMail)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrRejected)
	var se *StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusServiceUnavailable, se.StatusCode)
	require.Contains(t, se.Message, "nothing was sent")
	r, err := c.Send(ctx, key, ticketMail)
	require.NoError(t, err)
	require.False(t, r.Replayed)

	// A 500 after the message left: the retry with the same key replays.
	require.NoError(t, c.SetFaults(ctx, Faults{FailAfterSendNext: 1}))
	key2 := sdk.KeyForTest("tickets-4472")
	_, err = c.Send(ctx, key2, ticketMail)
	require.ErrorContains(t, err, "500")
	require.NotErrorIs(t, err, ErrRejected)
	lost, err := c.Messages(ctx)
	require.NoError(t, err)
	require.Len(t, lost, 2, "the message left although Send failed")
	r, err = c.Send(ctx, key2, ticketMail)
	require.NoError(t, err)
	require.Equal(t, Receipt{ID: lost[1].ID, Replayed: true}, r)

	msgs, err := c.Messages(ctx)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Sent: 2, Replayed: 1, FailedInjected: 2}, stats)
}

func TestClientTimeoutThenRetrySendsOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := startProvider(t, t.TempDir()).client()
	key := sdk.KeyForTest("tickets-4471")

	require.NoError(t, c.SetFaults(ctx, Faults{DelayNext: 1, DelayMS: 1500}))
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := c.Send(short, key, ticketMail)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, ErrRejected)

	r, err := c.Send(ctx, key, ticketMail)
	require.NoError(t, err)
	require.NotEmpty(t, r.ID)
	msgs, err := c.Messages(ctx)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, r.ID, msgs[0].ID)
}

// --- The client alone, against httptest servers. ---

func TestSendRequest(t *testing.T) {
	t.Parallel()
	var got struct {
		method, path, key, contentType string
		body                           []byte
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path = r.Method, r.URL.Path
		got.key, got.contentType = r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type")
		got.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"id":"msg_1","status":"queued"}`)
	}))
	t.Cleanup(ts.Close)

	c := &Client{BaseURL: ts.URL + "/", HTTP: ts.Client()}
	r, err := c.Send(t.Context(), sdk.KeyForTest("tickets-4471"), ticketMail)
	require.NoError(t, err)
	require.Equal(t, Receipt{ID: "msg_1", Replayed: true}, r)
	require.Equal(t, http.MethodPost, got.method)
	require.Equal(t, "/v1/messages", got.path)
	require.Equal(t, "tickets-4471", got.key)
	require.Equal(t, "application/json", got.contentType)
	require.JSONEq(t, `{"to":"ada@example.com","subject":"Your tickets for order 4471","text":"Two tickets are attached.",
		"attachments":[{"name":"ticket-1.pdf","sha256":"`+strings.Repeat("a", 64)+`"},{"name":"ticket-2.pdf","sha256":"`+strings.Repeat("b", 64)+`"}]}`,
		string(got.body))
}

func TestEncodeMessageIsDeterministic(t *testing.T) {
	t.Parallel()
	a, err := EncodeMessage(ticketMail)
	require.NoError(t, err)
	copied := ticketMail
	copied.Attachments = append([]Attachment(nil), ticketMail.Attachments...)
	b, err := EncodeMessage(copied)
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.True(t, strings.HasPrefix(string(a), `{"to":`), "field order is struct order: %s", a)

	noneNil, err := EncodeMessage(Message{To: "x"})
	require.NoError(t, err)
	noneEmpty, err := EncodeMessage(Message{To: "x", Attachments: []Attachment{}})
	require.NoError(t, err)
	require.Equal(t, noneNil, noneEmpty, "nil and empty attachments are the same message")
}

func TestSendRefusesAKeyNotFromAnIntent(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(ts.Close)

	c := &Client{BaseURL: ts.URL, HTTP: ts.Client()}
	_, err := c.Send(t.Context(), sdk.IdempotencyKey{}, ticketMail)
	require.ErrorContains(t, err, "idempotency key")
	require.Zero(t, calls.Load(), "no request leaves without a key")
}

func TestSendErrorClassification(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status    int
		body      string
		rejected  bool
		wantInErr string
	}{
		{400, `{"error":"missing Idempotency-Key header"}`, true, "missing Idempotency-Key header"},
		{413, `{"error":"request body is larger than the limit of 1048576 bytes"}`, true, "larger than the limit"},
		{422, `{"error":"idempotency key tickets-4471 was already used with a different request body"}`, true, "tickets-4471"},
		{408, `{"error":"timeout"}`, false, "timeout"},
		{409, `{"error":"a request with idempotency key tickets-4471 is in progress"}`, false, "in progress"},
		{429, `{"error":"slow down"}`, false, "slow down"},
		{500, `internal error, not JSON`, false, "internal error, not JSON"},
		{503, ``, false, "(empty body)"},
		{202, `{"status":"queued"}`, false, "without a message id"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			t.Cleanup(ts.Close)
			c := &Client{BaseURL: ts.URL, HTTP: ts.Client()}

			_, err := c.Send(t.Context(), sdk.KeyForTest("tickets-4471"), ticketMail)
			require.Error(t, err)
			require.Equal(t, tc.rejected, errors.Is(err, ErrRejected), "%v", err)
			require.ErrorContains(t, err, fmt.Sprint(tc.status))
			require.ErrorContains(t, err, tc.wantInErr)
		})
	}
}

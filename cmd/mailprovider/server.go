package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxBodyBytes is the largest message request accepted (413 beyond).
	maxBodyBytes = 1 << 20
	// maxKeyBytes is the longest Idempotency-Key accepted.
	maxKeyBytes = 255
	// maxDelay bounds delay_ms of the fault plan.
	maxDelay = 10 * time.Minute

	idempotencyHeader = "Idempotency-Key"
	replayedHeader    = "Idempotent-Replayed"
)

// Options tunes a Server.
type Options struct {
	// FailRate is the probability (0..1) that a message request fails with
	// 503 before anything is sent.
	FailRate float64
	// Seed seeds the random faults of FailRate.
	Seed uint64
	// Logger receives one line per send, replay, conflict and fault; nil
	// discards.
	Logger *slog.Logger
	// Now is the clock of sent_at; nil is time.Now.
	Now func() time.Time

	// beforeSend, when set (by tests), runs after a key was found new and
	// before its send is recorded: the window a per-key lock must cover.
	beforeSend func(s *Server, key string)
}

// Server is the fake provider's HTTP handler over a durable key table.
type Server struct {
	store  *store
	locks  keyLocks
	faults faults
	log    *slog.Logger
	now    func() time.Time
	mux    *http.ServeMux

	beforeSend func(s *Server, key string)

	replayed       atomic.Int64
	conflicts      atomic.Int64
	failedInjected atomic.Int64
}

// NewServer opens (or creates) the key table in dataDir and returns the
// handler. Close it to release the data directory.
func NewServer(dataDir string, opts Options) (*Server, error) {
	if opts.FailRate < 0 || opts.FailRate > 1 {
		return nil, fmt.Errorf("fail rate %g is outside 0..1", opts.FailRate)
	}
	st, err := openStore(dataDir)
	if err != nil {
		return nil, err
	}
	s := &Server{
		store: st,
		log:   opts.Logger,
		now:   opts.Now,
		mux:   http.NewServeMux(),

		beforeSend: opts.beforeSend,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.faults.init(opts.FailRate, opts.Seed)

	s.mux.HandleFunc("POST /v1/messages", s.handleSend)
	s.mux.HandleFunc("GET /_admin/messages", s.handleMessages)
	s.mux.HandleFunc("GET /_admin/stats", s.handleStats)
	s.mux.HandleFunc("GET /_admin/faults", s.handleGetFaults)
	s.mux.HandleFunc("POST /_admin/faults", s.handleSetFaults)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close releases the key table. It is safe to call more than once.
func (s *Server) Close() error { return s.store.close() }

// sendResponse is the body of a successful send.
type sendResponse struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// handleSend is POST /v1/messages: the provider's idempotent send.
func (s *Server) handleSend(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idempotencyHeader)
	if key == "" {
		writeError(w, http.StatusBadRequest, "missing Idempotency-Key header")
		return
	}
	if len(key) > maxKeyBytes {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Idempotency-Key header is longer than %d bytes", maxKeyBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request body is larger than the limit of %d bytes", maxBodyBytes))
			return
		}
		writeError(w, http.StatusBadRequest, "could not read request body: "+err.Error())
		return
	}
	var fields map[string]any
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		writeError(w, http.StatusBadRequest, "request body must be a JSON object")
		return
	}
	sum := sha256.Sum256(body)
	bodyHash := hex.EncodeToString(sum[:])
	log := s.log.With("key", key)

	// Injected delay: before any processing, so a client that gives up
	// during it leaves nothing behind.
	if d := s.faults.takeDelay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			log.Info("client gave up during injected delay; nothing sent", "delay", d)
			return
		}
	}
	// Injected failure before sending: nothing sent, key not recorded.
	if status, ok := s.faults.takeFailure(); ok {
		s.failedInjected.Add(1)
		log.Info("injected failure before send", "status", status)
		writeError(w, status, fmt.Sprintf("injected failure (%d): nothing was sent", status))
		return
	}

	// One request per key at a time: a concurrent duplicate waits here and
	// then replays. Waiting is the only point that still heeds the client
	// giving up; once past it, the send completes regardless.
	unlock, err := s.locks.lock(r.Context(), key)
	if err != nil {
		log.Info("client gave up waiting for the key; nothing done")
		return
	}
	defer unlock()

	if rec, ok := s.store.lookup(key); ok {
		if rec.BodySHA256 != bodyHash {
			s.conflicts.Add(1)
			log.Info("conflict: key reused with another body")
			writeError(w, http.StatusUnprocessableEntity,
				fmt.Sprintf("idempotency key %s was already used with a different request body", key))
			return
		}
		s.replayed.Add(1)
		log.Info("replay", "id", rec.Message.ID)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(replayedHeader, "true")
		w.WriteHeader(rec.Status)
		io.WriteString(w, rec.Response)
		return
	}

	if s.beforeSend != nil {
		s.beforeSend(s, key)
	}
	id, err := newMessageID()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "could not assign a message id")
		return
	}
	resp, err := json.Marshal(sendResponse{ID: id, Status: "queued"})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "could not encode the response")
		return
	}
	to, _ := fields["to"].(string)
	subject, _ := fields["subject"].(string)
	rec := &record{
		Key:        key,
		BodySHA256: bodyHash,
		Status:     http.StatusAccepted,
		Response:   string(resp),
		Message: sentMessage{
			ID:             id,
			IdempotencyKey: key,
			BodySHA256:     bodyHash,
			To:             to,
			Subject:        subject,
			SentAt:         s.now().UTC(),
		},
	}
	// Durable before the answer: a crash after this line and before the
	// response leaves the key recorded, and the client's retry replays.
	if err := s.store.append(rec); err != nil {
		log.Error("could not record the send; nothing sent", "err", err)
		writeError(w, http.StatusInternalServerError, "could not record the message; nothing was sent")
		return
	}
	log.Info("sent", "id", id, "to", to)

	if s.faults.takeFailAfterSend() {
		s.failedInjected.Add(1)
		log.Info("injected failure after send", "id", id)
		writeError(w, http.StatusInternalServerError, "internal error (injected after send)")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rec.Status)
	io.WriteString(w, rec.Response)
}

// messagesResponse is the body of GET /_admin/messages.
type messagesResponse struct {
	Count    int           `json:"count"`
	Messages []sentMessage `json:"messages"`
}

func (s *Server) handleMessages(w http.ResponseWriter, _ *http.Request) {
	msgs := s.store.messages()
	if msgs == nil {
		msgs = []sentMessage{}
	}
	writeJSON(w, http.StatusOK, messagesResponse{Count: len(msgs), Messages: msgs})
}

// statsResponse is the body of GET /_admin/stats. Sent counts every message
// in the durable sent log (so it survives a restart); the other counters
// are since the process started.
type statsResponse struct {
	Sent           int64 `json:"sent"`
	Replayed       int64 `json:"replayed"`
	Conflicts      int64 `json:"conflicts"`
	FailedInjected int64 `json:"failed_injected"`
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, statsResponse{
		Sent:           int64(s.store.count()),
		Replayed:       s.replayed.Load(),
		Conflicts:      s.conflicts.Load(),
		FailedInjected: s.failedInjected.Load(),
	})
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.faults.get())
}

// handleSetFaults is POST /_admin/faults: it replaces the whole fault plan
// (fields left out are zero) and answers with the plan now in force.
func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	var p faultPlan
	if err := dec.Decode(&p); err != nil {
		writeError(w, http.StatusBadRequest, "bad fault plan: "+err.Error())
		return
	}
	if err := p.normalize(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.faults.set(p)
	s.log.Info("fault plan set", "plan", p)
	writeJSON(w, http.StatusOK, p)
}

// faultPlan is the body of POST /_admin/faults.
type faultPlan struct {
	// FailNext message requests fail with FailStatus, sending nothing and
	// recording nothing.
	FailNext   int `json:"fail_next"`
	FailStatus int `json:"fail_status"`
	// DelayNext message requests wait DelayMS before being handled.
	DelayNext int `json:"delay_next"`
	DelayMS   int `json:"delay_ms"`
	// FailAfterSendNext sends are recorded and then answered with 500.
	// Only requests that actually send consume it (replays do not).
	FailAfterSendNext int `json:"fail_after_send_next"`
}

func (p *faultPlan) normalize() error {
	if p.FailNext < 0 || p.DelayNext < 0 || p.DelayMS < 0 || p.FailAfterSendNext < 0 {
		return errors.New("fault counts and delay_ms must not be negative")
	}
	if p.FailStatus == 0 {
		p.FailStatus = http.StatusServiceUnavailable
	}
	if p.FailStatus < 400 || p.FailStatus > 599 {
		return fmt.Errorf("fail_status %d is not an error status (400..599)", p.FailStatus)
	}
	if time.Duration(p.DelayMS)*time.Millisecond > maxDelay {
		return fmt.Errorf("delay_ms %d is longer than %s", p.DelayMS, maxDelay)
	}
	return nil
}

// faults holds the fault plan and the random source of the fail rate.
type faults struct {
	mu       sync.Mutex
	plan     faultPlan
	failRate float64
	rng      *mrand.Rand
}

func (f *faults) init(rate float64, seed uint64) {
	f.failRate = rate
	f.rng = mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f.plan.FailStatus = http.StatusServiceUnavailable
}

func (f *faults) get() faultPlan {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.plan
}

func (f *faults) set(p faultPlan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plan = p
}

// takeDelay consumes one injected delay, if any.
func (f *faults) takeDelay() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.plan.DelayNext == 0 {
		return 0
	}
	f.plan.DelayNext--
	return time.Duration(f.plan.DelayMS) * time.Millisecond
}

// takeFailure consumes one planned failure, or draws one at the fail rate.
func (f *faults) takeFailure() (status int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.plan.FailNext > 0 {
		f.plan.FailNext--
		return f.plan.FailStatus, true
	}
	if f.failRate > 0 && f.rng.Float64() < f.failRate {
		return http.StatusServiceUnavailable, true
	}
	return 0, false
}

// takeFailAfterSend consumes one planned failure-after-send, if any.
func (f *faults) takeFailAfterSend() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.plan.FailAfterSendNext == 0 {
		return false
	}
	f.plan.FailAfterSendNext--
	return true
}

// keyLocks is a set of per-key locks that disappear when unused. A lock is
// a one-slot channel so that waiting for it can be abandoned.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{}
	refs int
}

// lock waits for key's lock, or for ctx to end (then it holds nothing).
func (k *keyLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*keyLock)
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()

	release := func() {
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// holders returns how many requests hold or wait for key's lock.
func (k *keyLocks) holders(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.m[key]; l != nil {
		return l.refs
	}
	return 0
}

// newMessageID returns "msg_" and 24 random hex digits.
func newMessageID() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "msg_" + hex.EncodeToString(b[:]), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":"could not encode the response"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeError answers {"error": msg}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{msg})
}
